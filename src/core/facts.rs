//! What is known about the cluster beyond a node's labels: the ClusterPolicy's operand
//! switches, the operand DaemonSets (which exist, and their real selectors), and where these
//! facts came from. One type, [`ClusterFacts`], for the webhook, `check` and the audit.

use std::collections::BTreeMap;
use std::convert::Infallible;

use crate::core::dra::DraNodes;
use crate::core::foreign::ForeignPlugins;
use crate::core::operands::{
    Labels, OPERANDS, OnGpuCluster, Operand, OperandSet, Stack, not_deployed,
};
use crate::core::operator::Sandbox;
use crate::core::placement::{
    NodePlacement, Placement, PodPlacement, TemplateInputs, Templates, Toleration,
};
use crate::core::version::Followed;

/// What is known about the cluster beyond the node itself, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterFacts {
    /// The ClusterPolicy deploys the container toolkit (`spec.toolkit.enabled`, true when unknown).
    /// When false, every host brings its own toolkit and the device plugin needs no DaemonSet.
    pub toolkit_managed: bool,
    /// Operands switched off in the ClusterPolicy: they run nowhere, whatever the labels say.
    pub disabled: OperandSet,
    /// Operand DaemonSets whose nodeSelector is not the default `<deploy key>: "true"`.
    pub selectors: BTreeMap<Operand, Labels>,
    /// Operands whose DaemonSet exists, when the DaemonSets were listed. An operand whose
    /// DaemonSet is known to be absent is expected nowhere (by the audit).
    pub daemonsets: Option<OperandSet>,
    /// Where the switches came from.
    pub source: PolicySource,
    /// The ClusterPolicy's `spec.sandboxWorkloads`: which deploy labels the operator gives a node.
    pub sandbox: Sandbox,
    /// `spec.driver.useNvidiaDriverCRD`: NVIDIADriver resources deploy the drivers, not the
    /// ClusterPolicy.
    pub driver_crd: bool,
    /// `spec.cdi.nriPluginEnabled` (v26.3+): the toolkit configures the runtime as an NRI plugin,
    /// and the operator deletes the `nvidia` RuntimeClasses.
    pub nri_plugin: bool,
    /// `spec.cdi.enabled` as the ClusterPolicy gives it; `None` when absent, which the operator
    /// reads as its version's default ([`ClusterFacts::cdi_enabled`]).
    pub cdi: Option<bool>,
    /// The nodeSelectors of the driver DaemonSets each NVIDIADriver controls, by its name, when
    /// the operator's DaemonSets were read: what runs now, including pools an earlier change
    /// stopped rendering that the operator keeps (before v26.3).
    pub nvidia_driver_daemonsets: Option<BTreeMap<String, Vec<Labels>>>,
    /// The NVIDIADriver resources, when they were listed.
    pub nvidia_drivers: Option<Vec<crate::core::nvidia_driver::NvidiaDriver>>,
    /// The GPU Operator version the decision follows (`docs/gpu-operator.md`, the eras), and
    /// where it came from or why it is assumed.
    pub operator: Followed,
    /// Which custom resource drives the operator: a ClusterPolicy, a GPUCluster (the DRA stack,
    /// v26.7+), or both (then neither is reconciled).
    pub stack: Stack,
    /// The ClusterPolicy the operator follows once the followed one is deleted (the operator
    /// follows one and marks the others `ignored`): its name and the facts its switches give.
    /// `None`: no other ClusterPolicy exists (or they were not listed).
    pub next_policy: Option<Box<(String, ClusterFacts)>>,
    /// Why it is not known whether a GPUCluster exists (not listed yet, RBAC forbids it, more
    /// than the guard keeps); `None` when it is known (listed, or no such CRD).
    pub gpu_clusters_unknown: Option<String>,
    /// The operand pod templates' tolerations and node affinity, which decide with a node's
    /// taints where the DaemonSet controller places a pod ([`crate::core::placement`]).
    pub templates: Templates,
    /// The nodes NVIDIA's DRA driver publishes GPU ResourceSlices for ([`DraNodes`]).
    pub dra_nodes: DraNodes,
    /// The device-plugin DaemonSets outside the operator's namespace ([`ForeignPlugins`]).
    pub foreign_plugins: ForeignPlugins,
}

impl Default for ClusterFacts {
    fn default() -> Self {
        ClusterFacts {
            toolkit_managed: true,
            disabled: OperandSet::EMPTY,
            selectors: BTreeMap::new(),
            daemonsets: None,
            source: PolicySource::NotGiven,
            sandbox: Sandbox::default(),
            driver_crd: false,
            nri_plugin: false,
            cdi: None,
            nvidia_driver_daemonsets: None,
            nvidia_drivers: None,
            operator: Followed::default(),
            stack: Stack::ClusterPolicy,
            next_policy: None,
            gpu_clusters_unknown: None,
            templates: Templates::default(),
            dra_nodes: DraNodes::NotRead,
            foreign_plugins: ForeignPlugins::NotRead,
        }
    }
}

/// The ClusterPolicy field that turns sandbox workloads (and so the sandbox operands) on.
pub const SANDBOX_WORKLOADS: &str = "sandboxWorkloads";

/// The operands a GPUCluster switches off (its DCGM host engine and DCGM exporter), given how
/// to read one `spec.<field>.enabled` switch: `None` when the `spec.<field>` object is absent,
/// which keeps the operand off (gpu-operator@v26.7.0 `internal/state/gpucluster.go`,
/// `dcgmEnabled`; `internal/state/dcgm_exporter.go`, `isEnabled`), else the value with the
/// default when `enabled` is absent. The GPUCluster deploys none of the ClusterPolicy's own
/// operands; those are off by the stack ([`ClusterFacts::off`]).
pub fn gpu_cluster_switched_off<E>(
    mut enabled: impl FnMut(&str, bool) -> Result<Option<bool>, E>,
) -> Result<OperandSet, E> {
    let mut disabled = OperandSet::EMPTY;
    for info in &OPERANDS {
        if let OnGpuCluster::Added(Some(s)) = info.on_gpu_cluster
            && enabled(s.field, s.default)? != Some(true)
        {
            disabled.insert(info.operand);
        }
    }
    Ok(disabled)
}

/// The operands a ClusterPolicy switches off, given how to read one `spec.<field>.enabled`
/// switch (with the operator's default when absent). Switches are read in table order,
/// `sandboxWorkloads` first, so the first bad one is the one reported.
pub fn switched_off<E>(
    mut enabled: impl FnMut(&str, bool) -> Result<bool, E>,
) -> Result<OperandSet, E> {
    let sandbox = enabled(SANDBOX_WORKLOADS, false)?;
    let mut disabled = OperandSet::EMPTY;
    for info in &OPERANDS {
        let switched_on = match info.switch {
            Some(s) => enabled(s.field, s.default)?,
            None => true,
        };
        if !switched_on || (info.needs_sandbox() && !sandbox) {
            disabled.insert(info.operand);
        }
    }
    Ok(disabled)
}

impl ClusterFacts {
    /// Why these facts are assumed instead of read from the cluster (no cluster access, the
    /// ClusterPolicy CRD is missing, RBAC forbids reading it, ...); `None` when they were read
    /// or given. Decisions made on assumed facts say so in their audit annotations.
    pub fn assumed(&self) -> Option<String> {
        self.source.is_unavailable().then(|| self.source.describe())
    }

    /// The operands that run nowhere: switched off in the ClusterPolicy, or never deployed by
    /// this version of the operator under these sandbox settings (`isStateEnabled`,
    /// `controllers/state_manager.go`; the rows' eras and modes, [`not_deployed`]). A DaemonSet
    /// of either kind that still exists is one the operator deletes, as for a switched-off one.
    pub fn off(&self) -> OperandSet {
        self.disabled.union(not_deployed(
            self.operator.era(),
            self.sandbox.mode,
            self.stack,
        ))
    }
    /// Evidence beats defaults: when the ClusterPolicy is unknown (its switches are the
    /// operator's defaults), an operand whose DaemonSet or pods the cluster shows is enabled.
    /// A ClusterPolicy that was read keeps its word.
    pub fn enable_seen(&mut self, present: OperandSet) {
        if matches!(
            self.source,
            PolicySource::Found(_) | PolicySource::GpuCluster(_)
        ) {
            return;
        }
        self.disabled = self
            .disabled
            .iter()
            .filter(|op| !present.contains(*op))
            .collect();
        if present.contains(Operand::ContainerToolkit) {
            self.toolkit_managed = true;
        }
    }

    /// The `cluster-facts` audit annotation: what the decision assumed instead of read (the
    /// ClusterPolicy's switches), then which operator version it followed and where that came
    /// from.
    pub fn annotation(&self) -> String {
        let mut version = self.operator.describe();
        if self.stack != Stack::ClusterPolicy {
            version = format!("{version}; {}", self.stack.describe());
        }
        match self.assumed() {
            None => version,
            Some(a) => format!("{a}; {version}"),
        }
    }

    /// The cluster's facts under ClusterPolicy `name`'s switches (`switches`, as
    /// `cluster_policy::from_object` reads them): what the cluster shows (selectors, DaemonSets,
    /// NVIDIADrivers, operator version, what is not known) stays; a GPUCluster that exists
    /// makes both stacks.
    pub fn with_cluster_policy(&self, name: &str, switches: &ClusterFacts) -> Self {
        let stack = match self.stack {
            Stack::ClusterPolicy => Stack::ClusterPolicy,
            Stack::GpuCluster | Stack::Both => Stack::Both,
        };
        ClusterFacts {
            selectors: self.selectors.clone(),
            daemonsets: self.daemonsets,
            nvidia_driver_daemonsets: self.nvidia_driver_daemonsets.clone(),
            nvidia_drivers: self.nvidia_drivers.clone(),
            operator: self.operator.clone(),
            source: PolicySource::Found(name.to_owned()),
            stack,
            next_policy: None,
            gpu_clusters_unknown: self.gpu_clusters_unknown.clone(),
            dra_nodes: self.dra_nodes.clone(),
            foreign_plugins: self.foreign_plugins.clone(),
            templates: Templates {
                inputs: switches.templates.inputs.clone(),
                ..self.templates.with_policy_tolerations(
                    &switches.templates.policy_tolerations,
                    self.operator.era(),
                    stack,
                    switches.driver_crd,
                )
            },
            ..switches.clone()
        }
    }

    /// The facts once the GPUCluster beside a ClusterPolicy is gone: the ClusterPolicy's alone.
    pub fn without_gpu_cluster(self) -> Self {
        ClusterFacts {
            stack: Stack::ClusterPolicy,
            ..self
        }
    }

    /// These facts (a ClusterPolicy's, or the defaults when none exists) once a GPUCluster
    /// named `name`, switching off `disabled` ([`gpu_cluster_switched_off`]) and giving its
    /// DaemonSets `tolerations` (`spec.daemonsets.tolerations`), is known to exist too. Without a ClusterPolicy it is the DRA stack: its switches, its NVIDIADriver
    /// drivers (`usesNvidiaDriverCRD`), no sandbox workloads. With one, the operator reconciles
    /// neither (gpu-operator@v26.7.0 `controllers/gpucluster_controller.go`,
    /// `validatePrerequisites`; `controllers/clusterpolicy_controller.go`, `Reconcile`;
    /// `controllers/nodelabeling_controller.go`, `Reconcile`): the ClusterPolicy's facts stay,
    /// on [`Stack::Both`].
    pub fn with_gpu_cluster(
        self,
        name: &str,
        disabled: OperandSet,
        tolerations: Vec<Toleration>,
        cluster_policy: bool,
    ) -> Self {
        if cluster_policy {
            return ClusterFacts {
                stack: Stack::Both,
                ..self
            };
        }
        let templates = Templates {
            policy_tolerations: tolerations,
            daemonsets: self.templates.daemonsets.clone(),
            inputs: TemplateInputs::default(),
        };
        ClusterFacts {
            templates,
            toolkit_managed: true,
            disabled,
            source: PolicySource::GpuCluster(name.to_owned()),
            sandbox: Sandbox::default(),
            driver_crd: true,
            nri_plugin: false,
            stack: Stack::GpuCluster,
            ..self
        }
    }

    /// CDI is on: `spec.cdi.enabled`, or when absent the default of the operator version
    /// followed (on from v25.10).
    pub fn cdi_enabled(&self) -> bool {
        self.cdi
            .unwrap_or_else(|| self.operator.version.cdi_on_by_default())
    }

    /// Whether the operator carries out a change of an NVIDIADriver under these facts
    /// (`docs/gpu-operator.md` §11.3). Unknown facts (no ClusterPolicy given offline, RBAC,
    /// no access) count as carried out: the change is judged by what it would do.
    pub fn nvidia_drivers_reconciled(&self) -> DriversReconciled {
        let era = self.operator.era();
        match (&self.source, self.stack) {
            (_, Stack::GpuCluster) => DriversReconciled::Yes,
            (PolicySource::Found(_), _)
                if !self.driver_crd && era.disables_nvidia_drivers_when_crd_off() =>
            {
                DriversReconciled::FlagOff
            }
            (PolicySource::Missing(_), _) if era.nvidia_drivers_need_cluster_policy() => {
                DriversReconciled::NoClusterPolicy
            }
            _ => DriversReconciled::Yes,
        }
    }

    /// The operator runs DCGM's host engine as its own DaemonSet (`nvidia-dcgm`), and so points
    /// the DCGM exporter at the `nvidia-dcgm` Service (`DCGM_REMOTE_HOSTENGINE_INFO`,
    /// gpu-operator@v25.3.4 `controllers/object_controls.go` l.1624–1625), which answers only on
    /// the same node (`internalTrafficPolicy: Local`, `assets/state-dcgm/0500_service.yaml`).
    /// Known from a ClusterPolicy read (its switch, on when absent), else from the operator's
    /// DaemonSets; with neither it is not assumed: the API's default is on, but the Helm chart
    /// renders `dcgm.enabled: false` (`docs/gpu-operator.md` §11.8).
    pub fn standalone_dcgm(&self) -> bool {
        if self.stack != Stack::ClusterPolicy || self.off().contains(Operand::Dcgm) {
            return false;
        }
        match (&self.source, self.daemonsets) {
            (PolicySource::Found(_), _) => true,
            (_, Some(present)) => present.contains(Operand::Dcgm),
            _ => false,
        }
    }

    /// The known ClusterPolicy runs its own driver DaemonSet (`nvidia-driver-daemonset`):
    /// `useNvidiaDriverCRD` off and the driver switched on. Without a ClusterPolicy read, the
    /// flag is not known, and NVIDIADriver changes are judged as if they were in charge.
    pub fn policy_driver_runs(&self) -> bool {
        matches!(self.source, PolicySource::Found(_))
            && self.stack == Stack::ClusterPolicy
            && !self.driver_crd
            && !self.off().contains(Operand::Driver)
    }

    /// The ClusterPolicy's own driver DaemonSet runs beside the NVIDIADriver ones: it runs, and
    /// this operator version reconciles NVIDIADrivers whatever the flag says (before v26.3).
    pub fn policy_driver_beside_nvidia_drivers(&self) -> bool {
        self.policy_driver_runs() && self.nvidia_drivers_reconciled() == DriversReconciled::Yes
    }

    /// Operand `op`'s pod template as the DaemonSet controller reads it
    /// ([`Templates::of`]).
    pub fn template(&self, op: Operand) -> PodPlacement {
        self.templates
            .of(op, self.operator.era(), self.stack, self.driver_crd)
    }

    /// Where the DaemonSet controller puts `op`'s pod on the node named `name` with these
    /// labels and taints, given that its selector picks the node. An untainted node needs no
    /// template unless a live one has a required node affinity.
    pub fn place(
        &self,
        op: Operand,
        name: &str,
        labels: &Labels,
        node: &NodePlacement,
    ) -> Placement {
        // The driver of an NVIDIADriver: that resource's template (its own tolerations), which
        // the one live driver template cannot tell apart when there are several.
        if op == Operand::Driver && self.driver_crd {
            let version = &self.operator.version;
            if let Some(driver) = self
                .nvidia_drivers
                .as_deref()
                .unwrap_or_default()
                .iter()
                .find(|d| d.selects(labels, version))
            {
                return driver.template().place(name, labels, true, node);
            }
        }
        if let Some(live) = self.templates.daemonsets.get(&op) {
            return live.place(name, labels, true, node);
        }
        if !node.is_tainted() {
            return Placement::Placed;
        }
        self.template(op).place(name, labels, true, node)
    }

    /// The facts a ClusterPolicy with these switched-off operands gives.
    pub fn from_switches(disabled: OperandSet) -> ClusterFacts {
        ClusterFacts {
            toolkit_managed: !disabled.contains(Operand::ContainerToolkit),
            disabled,
            ..ClusterFacts::default()
        }
    }
}

/// What the operator does without a word from a ClusterPolicy: every switch at its default
/// (node status exporter and sandbox operands off). The audit and the webhook fall back to
/// these facts when the ClusterPolicy is unknown.
pub fn operator_defaults() -> ClusterFacts {
    let Ok(defaults) = switched_off(|_, default| Ok::<bool, Infallible>(default));
    ClusterFacts::from_switches(defaults)
}

/// Whether the operator carries out a change of an NVIDIADriver
/// ([`ClusterFacts::nvidia_drivers_reconciled`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DriversReconciled {
    Yes,
    /// `spec.driver.useNvidiaDriverCRD` is off (v26.3+): the resource is set `disabled`, deploys
    /// nothing and keeps the DaemonSets it has.
    FlagOff,
    /// No ClusterPolicy exists (before v26.7): the reconcile fails and deploys nothing.
    NoClusterPolicy,
}

/// Where the ClusterPolicy facts came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicySource {
    /// Read from the named ClusterPolicy.
    Found(String),
    /// Read from the named GPUCluster (the DRA stack; no ClusterPolicy exists).
    GpuCluster(String),
    /// None was given (an audit of files without `--cluster-policy`): the operator's defaults.
    NotGiven,
    /// The CRD is not installed or no ClusterPolicy exists: the operator's defaults.
    Missing(String),
    /// RBAC forbids reading ClusterPolicies: the operator's defaults.
    Forbidden(String),
    /// Reading failed otherwise: the operator's defaults.
    Failed(String),
    /// `serve` cannot reach the cluster at all: the operator's defaults.
    NoAccess(String),
}

impl PolicySource {
    /// The facts are the defaults because the ClusterPolicy could not be read.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            PolicySource::Missing(_)
                | PolicySource::Forbidden(_)
                | PolicySource::Failed(_)
                | PolicySource::NoAccess(_)
        )
    }

    pub fn state(&self) -> &'static str {
        match self {
            PolicySource::Found(_) => "found",
            PolicySource::GpuCluster(_) => "gpu-cluster",
            PolicySource::NotGiven => "not-given",
            PolicySource::Missing(_) => "missing",
            PolicySource::Forbidden(_) => "forbidden",
            PolicySource::Failed(_) => "failed",
            PolicySource::NoAccess(_) => "no-access",
        }
    }

    /// One sentence for logs, notes and the report.
    pub fn describe(&self) -> String {
        match self {
            PolicySource::Found(name) => format!("operand switches read from ClusterPolicy {name}"),
            PolicySource::GpuCluster(name) => format!(
                "operand switches read from GPUCluster {name}: the DRA stack, no ClusterPolicy"
            ),
            PolicySource::NotGiven => {
                "no ClusterPolicy given: the GPU Operator's default operand switches are assumed"
                    .to_owned()
            }
            PolicySource::Missing(why)
            | PolicySource::Forbidden(why)
            | PolicySource::Failed(why) => {
                format!(
                    "ClusterPolicy unavailable ({why}): the GPU Operator's default operand switches are assumed"
                )
            }
            PolicySource::NoAccess(why) => format!(
                "no cluster access ({why}): the GPU Operator's default operand switches are assumed"
            ),
        }
    }
}
