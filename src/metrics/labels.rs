//! Label sets more than one component's families use.

use prometheus_client::encoding::EncodeLabelSet;

/// `result="..."`: how an attempt ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    pub(crate) result: &'static str,
}

/// `reason="..."`: why something was refused or failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub(crate) reason: &'static str,
}
