//! How long a node has been in the middle of something: a pause of its deploy labels, a driver
//! upgrade state, a MIG reconfiguration state.
//!
//! Labels carry no time. The node records of `serve` keep when each of these values was first
//! seen ([`timed`] says which), and the audit judges how long that is. Each replica keeps its
//! own records since it started, so a restart starts its clocks again: an age is at least
//! what it says, never more. Offline (`check`, `audit` of files or of
//! the API in one pass) nothing has been watched, so nothing has an age.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::core::operands::{DEPLOY_PREFIX, Value};
use crate::core::pauses::{Pauser, paused_by};

/// The driver upgrade state the GPU Operator's upgrade controller writes on each node
/// (NVIDIA/k8s-operator-libs `pkg/upgrade`: `UpgradeStateLabelKeyFmt`
/// `nvidia.com/%s-driver-upgrade-state` with the driver name `gpu`).
pub const DRIVER_UPGRADE_STATE_KEY: &str = "nvidia.com/gpu-driver-upgrade-state";

/// mig-manager's state of the node's MIG reconfiguration (NVIDIA/mig-parted
/// `deployments/gpu-operator/reconfigure-mig.sh`: `pending`, `rebooting`, `success`, `failed`).
pub const MIG_CONFIG_STATE_KEY: &str = "nvidia.com/mig.config.state";

/// The label keys besides the deploy labels whose values the records time.
pub const STATE_KEYS: [&str; 2] = [DRIVER_UPGRADE_STATE_KEY, MIG_CONFIG_STATE_KEY];

/// Where a driver upgrade stands, from `nvidia.com/gpu-driver-upgrade-state`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum UpgradeState {
    /// `upgrade-done`, `upgrade-skipped` (the old driver kept, the node back in service), or
    /// empty: nothing under way.
    Settled,
    /// Waiting for its turn (`upgrade-required`): the upgrade controller takes
    /// `maxParallelUpgrades` nodes at a time.
    Queued,
    /// Under way: cordoned, drained, the driver pod restarted or validated.
    UnderWay,
    /// `upgrade-failed`: the controller moves the node on only once its driver pod is ready.
    Failed,
    /// A value no release of the upgrade controller writes (as of k8s-operator-libs v0.0.x in
    /// the GPU Operator v26.7): judged as under way, and named as unknown.
    Unknown,
}

/// Every value the upgrade controller writes, in the order it moves a node through them
/// (NVIDIA/k8s-operator-libs `pkg/upgrade/consts.go`, the maintenance-operator and reboot
/// states of later releases included); the empty value (no upgrade seen) is settled too.
pub const UPGRADE_STATES: [(&str, UpgradeState); 16] = [
    ("upgrade-required", UpgradeState::Queued),
    ("cordon-required", UpgradeState::UnderWay),
    ("wait-for-jobs-required", UpgradeState::UnderWay),
    ("pod-deletion-required", UpgradeState::UnderWay),
    ("drain-required", UpgradeState::UnderWay),
    ("node-maintenance-required", UpgradeState::UnderWay),
    ("post-maintenance-required", UpgradeState::UnderWay),
    ("pod-restart-required", UpgradeState::UnderWay),
    ("reboot-required", UpgradeState::UnderWay),
    ("reboot-validation-required", UpgradeState::UnderWay),
    ("reboot-post-required", UpgradeState::UnderWay),
    ("validation-required", UpgradeState::UnderWay),
    ("uncordon-required", UpgradeState::UnderWay),
    ("upgrade-failed", UpgradeState::Failed),
    ("upgrade-done", UpgradeState::Settled),
    ("upgrade-skipped", UpgradeState::Settled),
];

impl UpgradeState {
    pub fn of(value: &str) -> UpgradeState {
        if value.is_empty() {
            return UpgradeState::Settled;
        }
        UPGRADE_STATES
            .iter()
            .find(|(known, _)| *known == value)
            .map_or(UpgradeState::Unknown, |(_, state)| *state)
    }
}

/// Whether the records time this label value: a paused deploy label, a driver upgrade state
/// other than settled, a MIG state other than `success`.
pub fn timed(key: &str, value: &str) -> bool {
    if key.starts_with(DEPLOY_PREFIX) {
        return Value::of(value) == Value::Paused;
    }
    match key {
        DRIVER_UPGRADE_STATE_KEY => UpgradeState::of(value) != UpgradeState::Settled,
        MIG_CONFIG_STATE_KEY => value != "success",
        _ => false,
    }
}

/// How long a pause or a driver upgrade state may last before the audit reports it
/// (`stuckAfter` in the configuration).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct StuckAfter {
    /// A deploy label paused by k8s-driver-manager, mig-manager or vgpu-device-manager. A MIG
    /// reconfiguration takes minutes (a reboot included, about ten); a driver install on one
    /// node, with its drain, tens of minutes.
    pub pause: Duration,
    /// A driver upgrade state other than settled. A large fleet upgrading one node at a time
    /// keeps nodes in `upgrade-required` for hours, so the default is a day.
    pub driver_upgrade: Duration,
}

impl Default for StuckAfter {
    fn default() -> Self {
        StuckAfter {
            pause: Duration::from_secs(60 * 60),
            driver_upgrade: Duration::from_secs(24 * 60 * 60),
        }
    }
}

impl StuckAfter {
    /// How long `key=value` may last before it is reported; `None` when no rule times it (a
    /// MIG state only explains a pause).
    pub fn limit(&self, key: &str, value: &str) -> Option<Duration> {
        if !timed(key, value) {
            return None;
        }
        if key.starts_with(DEPLOY_PREFIX) {
            Some(self.pause)
        } else if key == DRIVER_UPGRADE_STATE_KEY {
            Some(self.driver_upgrade)
        } else {
            None
        }
    }
}

/// One timed label as the records hold it: its value and when the guard first saw it (Unix
/// seconds).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Lasting<'a> {
    pub key: &'a str,
    pub value: &'a str,
    pub since: u64,
}

/// What a node's timed labels say at `now`: read by the audit's history rules.
#[derive(Copy, Clone, Debug)]
pub struct History<'a> {
    pub lasting: &'a [Lasting<'a>],
    /// Unix seconds.
    pub now: u64,
    pub stuck_after: StuckAfter,
}

impl<'a> History<'a> {
    /// Nothing watched: offline, or a node whose records hold no timed label.
    pub const NONE: History<'static> = History {
        lasting: &[],
        now: 0,
        stuck_after: StuckAfter {
            pause: Duration::MAX,
            driver_upgrade: Duration::MAX,
        },
    };

    fn age(&self, since: u64) -> Duration {
        Duration::from_secs(self.now.saturating_sub(since))
    }

    /// The timed value of `key`, with how long it has been seen.
    pub fn of(&self, key: &str) -> Option<(&'a str, Duration, u64)> {
        self.lasting
            .iter()
            .find(|l| l.key == key)
            .map(|l| (l.value, self.age(l.since), l.since))
    }

    /// Each pause under way, by component: the labels it holds (sorted), the value of the
    /// first, and when the oldest was first seen; only pauses past [`StuckAfter::pause`].
    pub fn stuck_pauses(&self) -> Vec<StuckPause<'a>> {
        let mut out: Vec<StuckPause<'a>> = Vec::new();
        for l in self
            .lasting
            .iter()
            .filter(|l| l.key.starts_with(DEPLOY_PREFIX))
        {
            let Some(by) = paused_by(l.value) else {
                continue;
            };
            match out.iter_mut().find(|p| p.by == by) {
                Some(p) => {
                    p.keys.push(l.key);
                    p.since = p.since.min(l.since);
                }
                None => out.push(StuckPause {
                    by,
                    keys: vec![l.key],
                    value: l.value,
                    since: l.since,
                }),
            }
        }
        out.retain(|p| self.age(p.since) >= self.stuck_after.pause);
        for p in &mut out {
            p.keys.sort_unstable();
        }
        out
    }

    /// The driver upgrade state, when it has lasted past [`StuckAfter::driver_upgrade`].
    pub fn stuck_upgrade(&self) -> Option<(&'a str, UpgradeState, u64)> {
        let (value, age, since) = self.of(DRIVER_UPGRADE_STATE_KEY)?;
        let state = UpgradeState::of(value);
        (state != UpgradeState::Settled && age >= self.stuck_after.driver_upgrade)
            .then_some((value, state, since))
    }
}

/// A pause past its limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StuckPause<'a> {
    pub by: Pauser,
    pub keys: Vec<&'a str>,
    pub value: &'a str,
    pub since: u64,
}

/// `1h 5m` (whole minutes; seconds under a minute).
pub fn duration_words(d: Duration) -> String {
    let secs = d.as_secs();
    let rounded = if secs >= 60 { secs - secs % 60 } else { secs };
    humantime::format_duration(Duration::from_secs(rounded)).to_string()
}

/// Unix seconds as RFC 3339 (`2026-12-05T14:01:54Z`).
pub fn timestamp_words(unix: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(unix)).to_string()
}

/// Unix seconds of `t` (0 before 1970).
pub fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_values_are_pauses_and_unsettled_states() {
        let dp = "nvidia.com/gpu.deploy.device-plugin";
        assert!(timed(dp, "paused-for-mig-change"));
        assert!(timed(dp, "true_paused-for-driver-upgrade"));
        assert!(!timed(dp, "true"));
        assert!(!timed(dp, "false"));
        assert!(timed(DRIVER_UPGRADE_STATE_KEY, "upgrade-failed"));
        assert!(timed(DRIVER_UPGRADE_STATE_KEY, "drain-required"));
        assert!(timed(DRIVER_UPGRADE_STATE_KEY, "no-such-state"));
        assert!(!timed(DRIVER_UPGRADE_STATE_KEY, "upgrade-done"));
        assert!(!timed(DRIVER_UPGRADE_STATE_KEY, "upgrade-skipped"));
        assert!(timed(MIG_CONFIG_STATE_KEY, "pending"));
        assert!(timed(MIG_CONFIG_STATE_KEY, "failed"));
        assert!(!timed(MIG_CONFIG_STATE_KEY, "success"));
        assert!(!timed("nvidia.com/mig.config", "all-1g.10gb"));
        assert_eq!(UpgradeState::of("no-such-state"), UpgradeState::Unknown);
        assert_eq!(UpgradeState::of("upgrade-required"), UpgradeState::Queued);
        assert_eq!(UpgradeState::of("reboot-required"), UpgradeState::UnderWay);
    }

    #[test]
    fn a_pause_is_stuck_from_its_oldest_label_and_only_past_the_limit() {
        let limits = StuckAfter {
            pause: Duration::from_secs(3600),
            driver_upgrade: Duration::from_secs(7200),
        };
        let lasting = [
            Lasting {
                key: "nvidia.com/gpu.deploy.gpu-feature-discovery",
                value: "paused-for-mig-change",
                since: 1_000,
            },
            Lasting {
                key: "nvidia.com/gpu.deploy.device-plugin",
                value: "paused-for-mig-change",
                since: 400,
            },
            Lasting {
                key: DRIVER_UPGRADE_STATE_KEY,
                value: "upgrade-failed",
                since: 0,
            },
        ];
        let at = |now| History {
            lasting: &lasting,
            now,
            stuck_after: limits,
        };
        assert!(at(3_999).stuck_pauses().is_empty(), "59 min 59 s: not yet");
        let stuck = at(4_000).stuck_pauses();
        assert_eq!(stuck.len(), 1);
        assert_eq!(stuck[0].by, Pauser::MigManager);
        assert_eq!(stuck[0].since, 400);
        assert_eq!(
            stuck[0].keys,
            [
                "nvidia.com/gpu.deploy.device-plugin",
                "nvidia.com/gpu.deploy.gpu-feature-discovery"
            ]
        );
        assert_eq!(at(7_199).stuck_upgrade(), None);
        assert_eq!(
            at(7_200).stuck_upgrade(),
            Some(("upgrade-failed", UpgradeState::Failed, 0))
        );
        assert!(History::NONE.stuck_pauses().is_empty());
        assert_eq!(History::NONE.stuck_upgrade(), None);
    }

    #[test]
    fn words() {
        assert_eq!(
            duration_words(Duration::from_secs(3 * 3600 + 12 * 60 + 9)),
            "3h 12m"
        );
        assert_eq!(duration_words(Duration::from_secs(42)), "42s");
        assert_eq!(timestamp_words(1_796_479_314), "2026-12-05T14:01:54Z");
    }
}
