//! The policies and cluster facts every fuzz target decides its inputs under.

use std::sync::OnceLock;

use gpu_deploy_guard::core::facts::{ClusterFacts, operator_defaults};
use gpu_deploy_guard::core::operands::Operand;
use gpu_deploy_guard::core::policy::Policy;
use gpu_deploy_guard::core::rules::Action;

pub struct Cases {
    pub policies: Vec<Policy>,
    pub facts: Vec<ClusterFacts>,
}

pub fn cases() -> &'static Cases {
    static CASES: OnceLock<Cases> = OnceLock::new();
    CASES.get_or_init(|| {
        let mut warn_all = Policy::default();
        warn_all.actions = warn_all.actions.map(|_| Action::Warn);
        let mut host_toolkit = operator_defaults();
        host_toolkit.toolkit_managed = false;
        // A DaemonSet selecting on a key outside the deploy labels makes the webhook read it.
        let mut custom_selector = operator_defaults();
        custom_selector.selectors.insert(
            Operand::DevicePlugin,
            [("example.com/gpu-pool".to_owned(), "a".to_owned())].into(),
        );
        Cases {
            policies: vec![Policy::default(), warn_all],
            facts: vec![
                ClusterFacts::default(),
                operator_defaults(),
                host_toolkit,
                custom_selector,
            ],
        }
    })
}
