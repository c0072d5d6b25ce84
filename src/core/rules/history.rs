//! The history rules: each judges how long a node has been in the middle of something, from
//! when the guard first saw its timed labels ([`History`]). Each is the function of its row of
//! [`RULES`](super::RULES) (`Check::Pods`: the audit alone sees it); offline nothing has been
//! watched, so they find nothing there.
//!
//! The failures they find: mig-manager leaving every deploy label at `paused-for-mig-change`
//! with `nvidia.com/mig.config.state` stuck `pending` or `failed` and the node advertising no
//! GPU (NVIDIA/gpu-operator#2833, NVIDIA/mig-parted#485); driver upgrades stuck for weeks in
//! `upgrade-required` or `upgrade-failed` (NVIDIA/gpu-operator#2509, #2549, #2820).

use super::pods::PodCtx;
use super::{Change, Found, Rule};
use crate::core::lasting::{
    DRIVER_UPGRADE_STATE_KEY, History, MIG_CONFIG_STATE_KEY, UPGRADE_STATES, UpgradeState,
    duration_words, timestamp_words,
};
use crate::core::pauses::Pauser;

/// Said of every time: what it is measured by. Messages give when a state was first seen, not
/// its age, so a report written from them changes only when the state does.
const CLOCK: &str = "by this guard's clock, which starts when it first sees the value and \
                     again when the guard restarts";

/// `pause-stuck`: a component has held deploy labels paused past `stuckAfter.pause`.
pub(super) fn pause_stuck(ctx: &PodCtx<'_>, out: &mut Vec<Found>) {
    let history = &ctx.history;
    for pause in history.stuck_pauses() {
        let by = pause.by;
        let state = match by {
            Pauser::MigManager => state_words(history, MIG_CONFIG_STATE_KEY),
            Pauser::DriverManager => state_words(history, DRIVER_UPGRADE_STATE_KEY),
            Pauser::VgpuDeviceManager => String::new(),
        };
        let advice = match by {
            Pauser::MigManager => {
                "Look at the nvidia-mig-manager pod on the node: its log names the MIG \
                 configuration (nvidia.com/mig.config) it could not apply; fix that \
                 configuration or the GPUs so the reconfiguration succeeds"
            }
            Pauser::DriverManager => {
                "Look at the driver pod on the node: its k8s-driver-manager init container \
                 waits for GPU pods to leave and for the node's drain, and its log says which \
                 pods hold it"
            }
            Pauser::VgpuDeviceManager => {
                "Look at the nvidia-vgpu-device-manager pod on the node: its log names the vGPU \
                 configuration (nvidia.com/vgpu.config) it could not apply"
            }
        };
        let labels = pause.keys.join(", ");
        let message = format!(
            "node {node}: {pauser} has held {labels} at {value} since {since} ({CLOCK}), \
             longer than stuckAfter.pause ({limit}){state}. Their operands stay off until \
             {pauser} writes the labels back {when}. {advice}; setting the labels to true by \
             hand starts the operands before that work is done.",
            node = ctx.node,
            pauser = by.name(),
            value = pause.value,
            since = timestamp_words(pause.since),
            limit = duration_words(history.stuck_after.pause),
            when = by.when(),
        );
        let warning = format!(
            "node {}: {} has held {} deploy label(s) at {} since {}",
            ctx.node,
            by.name(),
            pause.keys.len(),
            pause.value,
            timestamp_words(pause.since)
        );
        out.push(Found {
            rule: Rule::PauseStuck,
            change: Change::Existing,
            message,
            warning,
        });
    }
}

/// `; nvidia.com/mig.config.state is failed (since …)`, or nothing when the label is not timed.
fn state_words(history: &History<'_>, key: &str) -> String {
    match history.of(key) {
        Some((value, _, since)) => {
            format!("; {key} is {value} (since {})", timestamp_words(since))
        }
        None => String::new(),
    }
}

/// `driver-upgrade-stuck`: the node's driver upgrade state has lasted past
/// `stuckAfter.driverUpgrade`.
pub(super) fn driver_upgrade_stuck(ctx: &PodCtx<'_>, out: &mut Vec<Found>) {
    let history = &ctx.history;
    let Some((value, state, since)) = history.stuck_upgrade() else {
        return;
    };
    let what = match state {
        UpgradeState::Queued => {
            "it waits for its turn: the upgrade controller takes driver.upgradePolicy.\
             maxParallelUpgrades nodes at a time and none while maxUnavailable nodes are \
             unavailable, so a node stuck in another state holds the queue"
                .to_owned()
        }
        UpgradeState::UnderWay => {
            "the node is cordoned or being drained meanwhile: look for pods that a \
             PodDisruptionBudget or driver.upgradePolicy's drain and podDeletion settings keep \
             from leaving, and at the driver pod on the node"
                .to_owned()
        }
        UpgradeState::Failed => {
            "the upgrade failed, and the controller moves the node on only once its driver pod \
             is Running and ready: look at the driver pod on the node (its k8s-driver-manager \
             init container, then the driver container); the node may still be cordoned"
                .to_owned()
        }
        UpgradeState::Unknown => format!(
            "{value:?} is no state of the GPU Operator's upgrade controller this guard knows \
             ({}): another tool writes the label, or the operator is newer than this guard",
            UPGRADE_STATES.map(|(known, _)| known).join(", ")
        ),
        UpgradeState::Settled => return,
    };
    let message = format!(
        "node {node} has been in driver upgrade state {value} ({DRIVER_UPGRADE_STATE_KEY}) since \
         {since_words} ({CLOCK}), longer than stuckAfter.driverUpgrade ({limit}): {what}.",
        node = ctx.node,
        since_words = timestamp_words(since),
        limit = duration_words(history.stuck_after.driver_upgrade),
    );
    let warning = format!(
        "node {} has been in driver upgrade state {value} since {}",
        ctx.node,
        timestamp_words(since)
    );
    out.push(Found {
        rule: Rule::DriverUpgradeStuck,
        change: Change::Existing,
        message,
        warning,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::facts::operator_defaults;
    use crate::core::lasting::{Lasting, StuckAfter};

    fn found(lasting: &[Lasting<'_>], now: u64) -> Vec<Found> {
        let facts = operator_defaults();
        let ctx = PodCtx {
            node: "gpu-1",
            operands: &[],
            facts: &facts,
            history: History {
                lasting,
                now,
                stuck_after: StuckAfter::default(),
            },
            advertised: None,
            gfd_count: None,
        };
        let mut out = Vec::new();
        pause_stuck(&ctx, &mut out);
        driver_upgrade_stuck(&ctx, &mut out);
        out
    }

    fn upgrade(value: &str) -> [Lasting<'_>; 1] {
        [Lasting {
            key: DRIVER_UPGRADE_STATE_KEY,
            value,
            since: 0,
        }]
    }

    #[test]
    fn each_upgrade_state_says_what_it_waits_for() {
        let day = 86_400;
        assert!(found(&upgrade("upgrade-failed"), day - 1).is_empty());
        for (state, says) in [
            ("upgrade-required", "maxParallelUpgrades"),
            ("drain-required", "PodDisruptionBudget"),
            ("upgrade-failed", "the upgrade failed"),
            (
                "upgrade-pending-forever",
                "\"upgrade-pending-forever\" is no state of the GPU Operator's upgrade controller",
            ),
        ] {
            let out = found(&upgrade(state), day);
            assert_eq!(out.len(), 1, "{state}");
            assert_eq!(out[0].rule, Rule::DriverUpgradeStuck);
            assert!(
                out[0].message.starts_with(&format!(
                    "node gpu-1 has been in driver upgrade state {state} \
                     (nvidia.com/gpu-driver-upgrade-state) since 1970-01-01T00:00:00Z"
                )),
                "{}",
                out[0].message
            );
            assert!(out[0].message.contains(says), "{}", out[0].message);
            assert!(
                out[0]
                    .message
                    .contains("longer than stuckAfter.driverUpgrade (1day)")
            );
        }
        // Settled states are not timed, so never stuck.
        assert!(found(&upgrade("upgrade-done"), 10 * day).is_empty());
    }

    #[test]
    fn a_driver_upgrade_pause_names_k8s_driver_manager_and_the_upgrade_state() {
        let lasting = [
            Lasting {
                key: "nvidia.com/gpu.deploy.device-plugin",
                value: "paused-for-driver-upgrade",
                since: 60,
            },
            Lasting {
                key: DRIVER_UPGRADE_STATE_KEY,
                value: "pod-restart-required",
                since: 0,
            },
        ];
        let out = found(&lasting, 3_660);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].rule, Rule::PauseStuck);
        assert!(
            out[0].message.contains(
                "k8s-driver-manager has held nvidia.com/gpu.deploy.device-plugin at \
                 paused-for-driver-upgrade since 1970-01-01T00:01:00Z"
            ),
            "{}",
            out[0].message
        );
        assert!(out[0].message.contains(
            "; nvidia.com/gpu-driver-upgrade-state is pod-restart-required (since 1970-01-01T00:00:00Z)"
        ));
        assert!(out[0].message.contains("when the driver upgrade ends"));
    }
}
