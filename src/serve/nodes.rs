//! The node follower: every replica's compact record of every node ([`SharedFleet`]), from a
//! watch of the whole nodes (labels and taints).

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher::{self};
use tokio::sync::{mpsc, watch};

use super::follow::{Index, Over, Watch, watcher};
use super::health::{Kind, Status, unavailable};
use super::watch_config::DEFAULT_PAGE_SIZE;
use crate::core::facts::ClusterFacts;
use crate::k8s::api::list_pages_with;
use crate::k8s::fleet::{LabelFilter, SharedFleet, Trouble};
use crate::k8s::node::NodeView;

/// Keeps `fleet`'s node records current from a watch of the whole nodes. The records
/// keep the labels the facts' selectors read too: when new facts read a label the records do
/// not hold, it is read from the nodes that carry it (a labelled list), not from the whole
/// fleet; only if that fails are the nodes listed again (the old records serve meanwhile).
pub(super) async fn follow_nodes(
    client: &Client,
    cfg: watcher::Config,
    fleet: &SharedFleet,
    mut facts: watch::Receiver<Arc<ClusterFacts>>,
    status: &Mutex<Status>,
    namespace: &str,
    dirty: &mpsc::Sender<()>,
) {
    let mut index = NodeIndex { fleet, dirty };
    loop {
        let mut filter = wanted(&mut facts, fleet);
        fleet.lock().nodes.set_filter(filter.clone());
        let stream = watcher(Api::<NodeView>::all(client.clone()), cfg.clone());
        futures::pin_mut!(stream);
        let mut watch = Watch::new(Kind::Nodes, namespace, status);
        loop {
            let item = tokio::select! {
                item = stream.next() => match item {
                    Some(item) => Some(item),
                    None => return,
                },
                changed = facts.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    None
                }
                () = fleet.keys_wanted.notified() => None,
            };
            let Some(item) = item else {
                let wanted = wanted(&mut facts, fleet);
                if filter.covers(&wanted) {
                    continue;
                }
                // Keep the new keys from now on (every event from here carries them), and
                // read them from the nodes that have them: a labelled list, not the fleet.
                let keys = filter.missing_from(&wanted);
                filter = filter.union(&wanted);
                fleet.lock().nodes.set_filter(filter.clone());
                match learn_keys(client, &cfg, fleet, &keys).await {
                    Ok(read) => {
                        tracing::info!(keys = %keys.join(","), nodes = read, "an operand nodeSelector reads labels the node records did not keep: read them from the nodes that carry them");
                        fleet.changed.notify_one();
                        continue;
                    }
                    Err(error) => {
                        tracing::warn!(keys = %keys.join(","), %error, "cannot read the new selector labels from the nodes that carry them: listing the nodes again");
                        break;
                    }
                }
            };
            // The node records have no bounds.
            let _ = watch.step(item, &mut index);
        }
    }
}

/// The node records as an index: a change wakes the auditor ([`SharedFleet::changed`]); a change
/// of the nodes' health wakes the facts publisher too (readiness waits for the nodes).
struct NodeIndex<'a> {
    fleet: &'a SharedFleet,
    dirty: &'a mpsc::Sender<()>,
}

impl Index<NodeView> for NodeIndex<'_> {
    fn init(&mut self) {
        self.fleet.lock().nodes.start_relist();
    }

    fn init_apply(&mut self, node: NodeView) {
        self.fleet.lock().nodes.relist_apply(&node);
    }

    fn init_done(&mut self) -> Result<(), Over> {
        let mut state = self.fleet.lock();
        let changed = state.nodes.finish_relist();
        for name in &changed {
            state.dirty.add(name);
        }
        state.synced = true;
        state.set_trouble(None, std::time::Instant::now());
        Ok(())
    }

    fn apply(&mut self, node: NodeView) -> Result<bool, Over> {
        let mut state = self.fleet.lock();
        state.resumed();
        let changed = state.nodes.apply(&node);
        if changed {
            state.dirty.add(node.name());
        }
        Ok(changed)
    }

    fn delete(&mut self, node: NodeView) -> bool {
        let mut state = self.fleet.lock();
        state.resumed();
        let changed = state.nodes.delete(node.name());
        if changed {
            state.dirty.add(node.name());
        }
        changed
    }

    fn failed(&mut self, error: &watcher::Error) {
        let trouble = match unavailable(error) {
            Some(_) => Trouble::Forbidden,
            None => Trouble::Interrupted,
        };
        self.fleet
            .lock()
            .set_trouble(Some(trouble), std::time::Instant::now());
    }

    fn changed(&mut self) {
        self.fleet.changed.notify_one();
    }

    fn health_changed(&mut self) {
        self.fleet.changed.notify_one();
        // Readiness waits for the nodes too.
        let _ = self.dirty.try_send(());
    }
}

/// What the records must keep: the labels the facts' selectors read, and the keys decisions
/// asked for ([`SharedFleet::request_keys`]).
fn wanted(facts: &mut watch::Receiver<Arc<ClusterFacts>>, fleet: &SharedFleet) -> LabelFilter {
    let base = LabelFilter::new(&facts.borrow_and_update());
    base.with_keys(&fleet.lock().requested_keys)
}

/// Reads `keys` into the node records from the nodes that carry them (one labelled list per
/// key, in pages), and returns how many nodes were read. The records' filter keeps the keys
/// already, so every later event carries them too.
async fn learn_keys(
    client: &Client,
    cfg: &watcher::Config,
    fleet: &SharedFleet,
    keys: &[String],
) -> Result<usize, kube::Error> {
    let api = Api::<NodeView>::all(client.clone());
    let mut read = 0;
    for key in keys {
        let params = kube::api::ListParams::default()
            .labels(key)
            .limit(cfg.page_size.unwrap_or(DEFAULT_PAGE_SIZE));
        list_pages_with(&api, params, |node| {
            let mut state = fleet.lock();
            if state.nodes.apply(&node) {
                state.dirty.add(node.name());
            }
            read += 1;
        })
        .await?;
    }
    Ok(read)
}
