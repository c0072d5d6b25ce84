//! The device-plugin DaemonSets outside the operator's namespace, followed through a watch of
//! every DaemonSet that reads each only for its device-plugin container and placement
//! ([`AnyDaemonSetView`]) and keeps only those ([`ForeignPlugin`]), at most
//! [`MAX_FOREIGN_PLUGINS`]: RBAC cannot narrow a list by what a DaemonSet runs, so the
//! narrowing is in what is read and kept.

use std::collections::BTreeMap;
use std::sync::Mutex;

use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::mpsc;

use super::follow::{Index, Over, Watch, watcher as stream};
use super::health::{Kind, Status};
use super::slices::over_bounds;
use crate::core::foreign::ForeignPlugin;
use crate::k8s::foreign::AnyDaemonSetView;

/// Device-plugin DaemonSets kept at most: a cluster runs one or two beside the operator's.
pub(super) const MAX_FOREIGN_PLUGINS: usize = 64;

/// The kept plugins by namespace and name.
pub(super) type Plugins = BTreeMap<(String, String), ForeignPlugin>;

/// Follows every DaemonSet into `kept` until the watch ends.
pub(super) async fn follow_plugins(
    client: &kube::Client,
    cfg: &watcher::Config,
    operator_namespace: &str,
    kept: &Mutex<Plugins>,
    status: &Mutex<Status>,
    dirty: &mpsc::Sender<()>,
) {
    let api = Api::<AnyDaemonSetView>::all(client.clone());
    let mut index = PluginsIndex {
        kept,
        operator_namespace,
        relist: None,
        bound: MAX_FOREIGN_PLUGINS,
        dirty,
    };
    loop {
        let watch = Watch::new(Kind::ForeignPlugins, operator_namespace, status);
        if watch
            .drive(stream(api.clone(), cfg.clone()), &mut index)
            .await
            .is_ok()
        {
            return;
        }
        lock(kept).clear();
        over_bounds(Kind::ForeignPlugins, MAX_FOREIGN_PLUGINS, status, dirty).await;
    }
}

pub(super) fn lock(kept: &Mutex<Plugins>) -> std::sync::MutexGuard<'_, Plugins> {
    kept.lock().unwrap_or_else(|e| e.into_inner())
}

struct PluginsIndex<'a> {
    kept: &'a Mutex<Plugins>,
    operator_namespace: &'a str,
    /// A list in progress, and whether it went past the bound.
    relist: Option<(Plugins, bool)>,
    bound: usize,
    dirty: &'a mpsc::Sender<()>,
}

fn key(ds: &AnyDaemonSetView) -> (String, String) {
    (ds.namespace().to_owned(), ds.name().to_owned())
}

impl Index<AnyDaemonSetView> for PluginsIndex<'_> {
    fn init(&mut self) {
        self.relist = Some((Plugins::new(), false));
    }

    fn init_apply(&mut self, ds: AnyDaemonSetView) {
        let namespace = self.operator_namespace;
        let (plugins, over) = self.relist.get_or_insert_with(|| (Plugins::new(), false));
        if let Some(plugin) = ds.foreign_plugin(namespace) {
            if plugins.len() >= self.bound {
                *over = true;
                return;
            }
            plugins.insert(key(&ds), plugin);
        }
    }

    fn init_done(&mut self) -> Result<(), Over> {
        let (plugins, over) = self.relist.take().unwrap_or_default();
        if over {
            return Err(Over);
        }
        *lock(self.kept) = plugins;
        Ok(())
    }

    fn apply(&mut self, ds: AnyDaemonSetView) -> Result<bool, Over> {
        let mut kept = lock(self.kept);
        let key = key(&ds);
        match ds.foreign_plugin(self.operator_namespace) {
            Some(plugin) => {
                if kept.len() >= self.bound && !kept.contains_key(&key) {
                    return Err(Over);
                }
                let changed = kept.get(&key) != Some(&plugin);
                kept.insert(key, plugin);
                Ok(changed)
            }
            // Not (or no longer) a device plugin: a change of any other DaemonSet is nothing.
            None => Ok(kept.remove(&key).is_some()),
        }
    }

    fn delete(&mut self, ds: AnyDaemonSetView) -> bool {
        lock(self.kept).remove(&key(&ds)).is_some()
    }

    fn changed(&mut self) {
        let _ = self.dirty.try_send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(namespace: &str, name: &str, image: &str) -> AnyDaemonSetView {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}
        }))
        .unwrap()
    }

    const PLUGIN: &str = "nvcr.io/nvidia/k8s-device-plugin:v0.17.1";

    #[test]
    fn only_foreign_device_plugins_are_kept_and_a_list_past_the_bound_keeps_nothing() {
        let kept = Mutex::new(Plugins::new());
        let (dirty, _rx) = mpsc::channel(1);
        let mut index = PluginsIndex {
            kept: &kept,
            operator_namespace: "gpu-operator",
            relist: None,
            bound: 2,
            dirty: &dirty,
        };
        index.init();
        index.init_apply(ds("nvdp", "a", PLUGIN));
        index.init_apply(ds("gpu-operator", "nvidia-device-plugin-daemonset", PLUGIN));
        for i in 0..100 {
            index.init_apply(ds("kube-system", &format!("other-{i}"), "busybox"));
        }
        assert_eq!(index.init_done(), Ok(()));
        assert_eq!(lock(&kept).len(), 1);
        // Another DaemonSet changing is no change; the plugin's image replaced is.
        assert_eq!(
            index.apply(ds("kube-system", "other-1", "busybox:2")),
            Ok(false)
        );
        assert_eq!(index.apply(ds("nvdp", "a", PLUGIN)), Ok(false), "unchanged");
        assert_eq!(index.apply(ds("nvdp", "b", PLUGIN)), Ok(true));
        assert_eq!(index.apply(ds("nvdp", "c", PLUGIN)), Err(Over));
        assert_eq!(index.apply(ds("nvdp", "a", "busybox")), Ok(true));
        assert!(index.delete(ds("nvdp", "b", PLUGIN)));
        assert!(lock(&kept).is_empty());
        index.init();
        for i in 0..3 {
            index.init_apply(ds("nvdp", &format!("p-{i}"), PLUGIN));
        }
        assert_eq!(index.init_done(), Err(Over));
    }
}
