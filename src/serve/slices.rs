//! The ResourceSlices of NVIDIA's GPU DRA driver, followed cluster-wide through a watch
//! narrowed to that driver (`spec.driver` field selector) and kept as slice name to node
//! ([`SliceIndex`]): what `device-plugin-beside-dra-driver` reads. Their devices are skipped
//! unbuilt ([`ResourceSliceView`]). Past [`MAX_SLICES`] nothing is kept and the kind is
//! unavailable (the decisions say they cannot tell) until a list fits again.

use std::sync::Mutex;

use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio::time::sleep;

use super::follow::{Index, OVER_BOUNDS_PAUSE, Over, Watch, set_health, watcher as stream};
use super::health::{Health, Kind, Status, Unavailable};
use crate::core::dra::{Read, SliceIndex};
use crate::k8s::resource_slice::{self, ResourceSliceView};

/// Slices kept at most: four per node of a 5,000-node fleet (the driver publishes one per node
/// and pool). About 150 bytes each: 3 MB at the bound.
pub(super) const MAX_SLICES: usize = 20_000;

/// Follows the slices into `kept` until the watch ends, at the version the cluster serves
/// best: discovered first, and again every [`DISCOVERY_PAUSE`] while the cluster serves none
/// (DRA off: no slice can exist) or discovery fails (they stay unknown).
pub(super) async fn follow_slices(
    client: &kube::Client,
    cfg: &watcher::Config,
    kept: &Mutex<SliceIndex>,
    status: &Mutex<Status>,
    dirty: &mpsc::Sender<()>,
) {
    let cfg = cfg.clone().fields(&resource_slice::field_selector());
    let mut index = SlicesIndex {
        kept,
        relist: None,
        bound: MAX_SLICES,
        dirty,
    };
    let mut said = None;
    loop {
        let ar = match resource_slice::served(client).await {
            Ok(Some(ar)) => ar,
            outcome => {
                let (health, why) = match outcome {
                    Ok(_) => (
                        Health::Unavailable(Unavailable::NotFound),
                        "the cluster serves no resource.k8s.io: no ResourceSlice can exist"
                            .to_owned(),
                    ),
                    Err(e) => (
                        Health::Starting,
                        format!("discovering resource.k8s.io failed: {e}"),
                    ),
                };
                if said.as_ref() != Some(&why) {
                    tracing::info!(%why, "ResourceSlices; looking again in {DISCOVERY_PAUSE:?}");
                    said = Some(why);
                }
                if set_health(status, Kind::ResourceSlices, health.clone()) != health {
                    let _ = dirty.try_send(());
                }
                sleep(DISCOVERY_PAUSE).await;
                continue;
            }
        };
        tracing::info!(version = %ar.api_version, "following ResourceSlices");
        let api = Api::<ResourceSliceView>::all_with(client.clone(), &ar);
        let watch = Watch::new(Kind::ResourceSlices, "", status);
        if watch
            .drive(stream(api, cfg.clone()), &mut index)
            .await
            .is_ok()
        {
            return;
        }
        lock(kept).clear();
        over_bounds(Kind::ResourceSlices, MAX_SLICES, status, dirty).await;
    }
}

/// How long a cluster without `resource.k8s.io` (or whose discovery failed) waits before the
/// guard looks for ResourceSlices again.
const DISCOVERY_PAUSE: std::time::Duration = std::time::Duration::from_secs(60);

/// A bounded kind went past its bound: it is unavailable (said once), its followers hear of
/// it, and it is listed again after [`OVER_BOUNDS_PAUSE`].
pub(super) async fn over_bounds(
    kind: Kind,
    bound: usize,
    status: &Mutex<Status>,
    dirty: &mpsc::Sender<()>,
) {
    let was = set_health(status, kind, Health::Unavailable(Unavailable::TooMany));
    if was != Health::Unavailable(Unavailable::TooMany) {
        tracing::warn!(
            what = %kind.describe(""),
            bound,
            "more than the guard keeps: the decisions that need them say they cannot tell; listing them again in 30s"
        );
    }
    let _ = dirty.try_send(());
    sleep(OVER_BOUNDS_PAUSE).await;
}

fn lock(kept: &Mutex<SliceIndex>) -> std::sync::MutexGuard<'_, SliceIndex> {
    kept.lock().unwrap_or_else(|e| e.into_inner())
}

/// The kept slices as an index: a list replaces them when complete; past `bound` it fails.
struct SlicesIndex<'a> {
    kept: &'a Mutex<SliceIndex>,
    /// A list in progress, and whether it went past the bound.
    relist: Option<(SliceIndex, bool)>,
    bound: usize,
    dirty: &'a mpsc::Sender<()>,
}

impl SlicesIndex<'_> {
    /// Reads one slice into `index`; a slice the field selector should have kept out (another
    /// driver) is not kept, and said.
    fn read(index: &mut SliceIndex, slice: &ResourceSliceView) {
        if let Read::OtherDriver(driver) = index.apply(slice.as_ref()) {
            tracing::warn!(
                slice = slice.name(),
                %driver,
                "a ResourceSlice of another driver came through the spec.driver field selector; not read"
            );
        }
    }
}

impl Index<ResourceSliceView> for SlicesIndex<'_> {
    fn init(&mut self) {
        self.relist = Some((SliceIndex::default(), false));
    }

    fn init_apply(&mut self, slice: ResourceSliceView) {
        let (index, over) = self
            .relist
            .get_or_insert_with(|| (SliceIndex::default(), false));
        if index.len() >= self.bound {
            *over = true;
            return;
        }
        Self::read(index, &slice);
    }

    fn init_done(&mut self) -> Result<(), Over> {
        let (index, over) = self.relist.take().unwrap_or_default();
        if over {
            return Err(Over);
        }
        *lock(self.kept) = index;
        Ok(())
    }

    fn apply(&mut self, slice: ResourceSliceView) -> Result<bool, Over> {
        let mut kept = lock(self.kept);
        if kept.len() >= self.bound && !kept.contains(slice.name()) {
            return Err(Over);
        }
        Self::read(&mut kept, &slice);
        Ok(true)
    }

    fn delete(&mut self, slice: ResourceSliceView) -> bool {
        lock(self.kept).delete(slice.name())
    }

    fn changed(&mut self) {
        let _ = self.dirty.try_send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, node: &str) -> ResourceSliceView {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node}
        }))
        .unwrap()
    }

    #[test]
    fn a_list_replaces_the_slices_and_past_the_bound_nothing_is_kept() {
        let kept = Mutex::new(SliceIndex::default());
        let (dirty, _rx) = mpsc::channel(1);
        let mut index = SlicesIndex {
            kept: &kept,
            relist: None,
            bound: 2,
            dirty: &dirty,
        };
        index.init();
        index.init_apply(slice("a-1", "a"));
        assert_eq!(index.init_done(), Ok(()));
        assert_eq!(lock(&kept).nodes().has("a"), Some(true));
        assert_eq!(index.apply(slice("b-1", "b")), Ok(true));
        assert_eq!(
            index.apply(slice("b-1", "b")),
            Ok(true),
            "a change of a kept one"
        );
        assert_eq!(index.apply(slice("c-1", "c")), Err(Over));
        assert!(index.delete(slice("a-1", "a")));
        assert_eq!(lock(&kept).nodes().has("a"), Some(false));
        // A list past the bound keeps nothing of itself (and the watch gives up).
        index.init();
        for i in 0..10 {
            index.init_apply(slice(&format!("n-{i}"), &format!("n{i}")));
        }
        assert_eq!(index.init_done(), Err(Over));
        assert_eq!(lock(&kept).len(), 1, "the last complete state until then");
    }
}
