//! Tolerations: how one matches a taint (kubernetes v1.34 `k8s.io/api/core/v1/toleration.go`,
//! `ToleratesTaint`), the ones the DaemonSet controller adds to every daemon pod
//! (`pkg/controller/daemon/util/daemonset_util.go`, `AddOrUpdateDaemonPodTolerations`), and the
//! checks the API server makes of one (`validateTolerations`), so that a file the cluster would
//! refuse gets an error here instead of a guess.

use std::fmt;

use serde::Serialize;

use super::{Effect, Taint, UNSCHEDULABLE_KEY};

/// `tolerations[].operator`. The API server accepts only these two (an empty operator is
/// `Equal`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum TolerationOperator {
    Exists,
    Equal,
}

/// One toleration of a pod template.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Toleration {
    /// Empty: every key (only with `Exists`).
    pub key: String,
    pub operator: TolerationOperator,
    /// Compared with `Equal`; empty with `Exists`.
    pub value: String,
    /// `None`: every effect.
    pub effect: Option<Effect>,
}

/// A toleration the API server would refuse, named.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TolerationError {
    #[error(
        "unknown toleration operator {0:?}: the API server accepts Exists and Equal (or none, which is Equal)"
    )]
    Operator(String),
    #[error(
        "unknown toleration effect {0:?}: the API server accepts NoSchedule, PreferNoSchedule, NoExecute (or none, which is every effect)"
    )]
    Effect(String),
    #[error("a toleration with operator Exists takes no value (it has {0:?})")]
    ValueWithExists(String),
    #[error("a toleration without a key must have operator Exists (it has Equal)")]
    EqualWithoutKey,
}

impl Toleration {
    /// `key` `Exists` for `effect` (every effect when `None`).
    pub fn exists(key: &str, effect: Option<Effect>) -> Toleration {
        Toleration {
            key: key.to_owned(),
            operator: TolerationOperator::Exists,
            value: String::new(),
            effect,
        }
    }

    /// `key` `Equal` `value` for `effect`.
    pub fn equal(key: &str, value: &str, effect: Option<Effect>) -> Toleration {
        Toleration {
            key: key.to_owned(),
            operator: TolerationOperator::Equal,
            value: value.to_owned(),
            effect,
        }
    }

    /// A toleration from its four fields as the API writes them (absent and empty alike), with
    /// the API server's own checks.
    pub fn parse(
        key: &str,
        operator: &str,
        value: &str,
        effect: &str,
    ) -> Result<Toleration, TolerationError> {
        let operator = match operator {
            "Exists" => TolerationOperator::Exists,
            "Equal" | "" => TolerationOperator::Equal,
            other => return Err(TolerationError::Operator(other.to_owned())),
        };
        let effect = match effect {
            "" => None,
            e => Some(Effect::parse(e).map_err(|_| TolerationError::Effect(e.to_owned()))?),
        };
        match operator {
            TolerationOperator::Exists if !value.is_empty() => {
                Err(TolerationError::ValueWithExists(value.to_owned()))
            }
            TolerationOperator::Equal if key.is_empty() => Err(TolerationError::EqualWithoutKey),
            _ => Ok(Toleration {
                key: key.to_owned(),
                operator,
                value: value.to_owned(),
                effect,
            }),
        }
    }

    /// Whether this toleration tolerates `taint`: the effect matches (or is every effect), the
    /// key matches (or is every key), and with `Equal` the value is the same string.
    pub fn tolerates(&self, taint: &Taint) -> bool {
        if self.effect.is_some_and(|e| e != taint.effect) {
            return false;
        }
        if !self.key.is_empty() && self.key != taint.key {
            return false;
        }
        match self.operator {
            TolerationOperator::Exists => true,
            TolerationOperator::Equal => self.value == taint.value,
        }
    }
}

/// As a ClusterPolicy or `kubectl` would show it: `key=value:Effect`, `key:Effect` for
/// `Exists`, `*` for an empty key, no `:Effect` for every effect.
impl fmt::Display for Toleration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = if self.key.is_empty() { "*" } else { &self.key };
        match self.operator {
            TolerationOperator::Exists => write!(f, "{key} Exists")?,
            TolerationOperator::Equal => write!(f, "{key}={}", self.value)?,
        }
        match self.effect {
            Some(e) => write!(f, ":{e}"),
            None => Ok(()),
        }
    }
}

/// The keys of the tolerations the DaemonSet controller adds to every daemon pod, each `Exists`
/// with this effect and no `tolerationSeconds` (kubernetes v1.34.12
/// `pkg/controller/daemon/util/daemonset_util.go` l.48–102): not-ready and unreachable for
/// `NoExecute` (a node that stops reporting keeps its daemon pods), the pressure conditions
/// and a cordon for `NoSchedule`.
const ADDED: [(&str, Effect); 6] = [
    ("node.kubernetes.io/not-ready", Effect::NoExecute),
    ("node.kubernetes.io/unreachable", Effect::NoExecute),
    ("node.kubernetes.io/disk-pressure", Effect::NoSchedule),
    ("node.kubernetes.io/memory-pressure", Effect::NoSchedule),
    ("node.kubernetes.io/pid-pressure", Effect::NoSchedule),
    (UNSCHEDULABLE_KEY, Effect::NoSchedule),
];

/// Added for a pod on the host's network only.
const ADDED_HOST_NETWORK: (&str, Effect) =
    ("node.kubernetes.io/network-unavailable", Effect::NoSchedule);

/// Whether the tolerations the DaemonSet controller adds to every daemon pod before it decides
/// where the pod runs (`NewPod` calls `AddOrUpdateDaemonPodTolerations`) tolerate `taint`: each
/// is `Exists` for one key and effect, the last only on a pod on the host's network.
pub fn added_tolerates(taint: &Taint, host_network: bool) -> bool {
    let host = host_network.then_some(ADDED_HOST_NETWORK);
    ADDED
        .into_iter()
        .chain(host)
        .any(|(key, effect)| taint.key == key && taint.effect == effect)
}
