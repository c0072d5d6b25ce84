//! Following one kind of object: the watch stream every kind is read through (retried within
//! seconds, listed again from scratch after a 403 or 404), the one watch driver ([`Watch`]:
//! kube's watcher events applied to an [`Index`] while the kind's health is recorded and said
//! in the log the same way for every kind), the GPU-policy objects kept as what the decisions
//! read ([`Following`]) and the reflector stores of the other kinds. The node records
//! ([`super::nodes`]) and the pod records ([`super::auditor`]) go through the same driver.

use std::sync::Mutex;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;
use tokio::time::sleep;

use super::health::{Health, Kind, Status, Unavailable, unavailable};
use super::kept::{Bounds, Fit, Kept};
use crate::k8s::policy_object::PolicyObject;

/// Pauses between the retries of a failing watch: 0.5 s doubling to [`RETRY_MAX`], plus up to
/// a quarter second of jitter. client-go's default (0.8 s doubling to 30 s) is kind to a
/// struggling API server, but a guard that decides on what it watches must follow the cluster
/// again within seconds of an API-server restart (with the default, new nodes were seen 16-18 s
/// after it). One request per kind every 5 s per replica is no burden while the API is down.
struct Retry {
    next: Duration,
}

const RETRY_START: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(5);

impl Default for Retry {
    fn default() -> Self {
        Retry { next: RETRY_START }
    }
}

impl Iterator for Retry {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let pause = self.next;
        self.next = (pause * 2).min(RETRY_MAX);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Some(pause + Duration::from_nanos(u64::from(nanos % 250_000_000)))
    }
}

impl kube::runtime::utils::Backoff for Retry {
    fn reset(&mut self) {
        self.next = RETRY_START;
    }
}

/// The longest pause before listing again a kind found missing or forbidden.
const RELIST_PAUSE_MAX: Duration = Duration::from_secs(5);

/// A watch of `api` that retries with backoff, and after a 404 or 403 starts again from a full
/// list (after a pause of 0.5 s doubling up to [`RELIST_PAUSE_MAX`]): kube's watcher would
/// resume the watch where it was and never list again, so a kind whose access came back would
/// stay marked unavailable; this way it is readable again as soon as a list succeeds
/// (`Event::InitDone`), and its store is the cluster's again.
pub(super) fn watcher<K>(
    api: Api<K>,
    cfg: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    type Inner<K> = futures::stream::BoxStream<'static, Result<Event<K>, watcher::Error>>;
    let state: (Option<Inner<K>>, Duration) = (None, Duration::ZERO);
    futures::stream::unfold(state, move |(inner, pause)| {
        let api = api.clone();
        let cfg = cfg.clone();
        async move {
            let mut inner = match inner {
                Some(inner) => inner,
                None => {
                    if !pause.is_zero() {
                        sleep(pause).await;
                    }
                    watcher::watcher(api, cfg).backoff(Retry::default()).boxed()
                }
            };
            let item = inner.next().await?;
            let next = match &item {
                Err(e) if unavailable(e).is_some() => {
                    let pause = (pause * 2).clamp(Duration::from_millis(500), RELIST_PAUSE_MAX);
                    (None, pause)
                }
                Ok(Event::InitDone) => (Some(inner), Duration::ZERO),
                _ => (Some(inner), pause),
            };
            Some((item, next))
        }
    })
}

/// GPU-policy objects per list page.
pub(super) const POLICY_PAGE_SIZE: u32 = 4;

/// How long a kind past its bounds waits before it is listed again.
pub(super) const OVER_BOUNDS_PAUSE: Duration = Duration::from_secs(30);

/// One kind of GPU-policy object followed into its [`Kept`] objects.
pub(super) struct Following<'a> {
    pub(super) api: Api<PolicyObject>,
    pub(super) cfg: watcher::Config,
    pub(super) kept: &'a Kept,
    pub(super) bounds: Bounds,
    pub(super) kind: Kind,
    pub(super) namespace: &'a str,
    pub(super) status: &'a Mutex<Status>,
    pub(super) dirty: &'a mpsc::Sender<()>,
}

impl Following<'_> {
    /// Keeps the objects and records how the watch is doing; every change marks the state
    /// dirty. Past the kind's bounds the kind is unavailable until a list fits again.
    pub(super) async fn run(self) {
        let Following {
            api,
            cfg,
            kept,
            bounds,
            kind,
            namespace,
            status,
            dirty,
        } = self;
        let mut index = KeptIndex {
            kept,
            bounds,
            dirty,
        };
        loop {
            let stream = watcher(api.clone(), cfg.clone());
            let watch = Watch::new(kind, namespace, status);
            if watch.drive(stream, &mut index).await.is_ok() {
                return;
            }
            kept.clear();
            let was = set_health(status, kind, Health::Unavailable(Unavailable::TooMany));
            if was != Health::Unavailable(Unavailable::TooMany) {
                tracing::warn!(
                    what = %kind.describe(namespace),
                    objects = bounds.objects,
                    bytes = bounds.bytes,
                    "more objects than the guard keeps: the decisions that need them refuse what could break nodes until they fit again; listing them again in 30s"
                );
            }
            let _ = dirty.try_send(());
            sleep(OVER_BOUNDS_PAUSE).await;
        }
    }
}

/// One kind's [`Kept`] objects within their bounds, as an index: every change marks the state
/// dirty.
struct KeptIndex<'a> {
    kept: &'a Kept,
    bounds: Bounds,
    dirty: &'a mpsc::Sender<()>,
}

impl KeptIndex<'_> {
    fn fit(&self, event: &Event<PolicyObject>) -> Result<(), Over> {
        match self.kept.apply(event, self.bounds) {
            Fit::Kept => Ok(()),
            Fit::Over => Err(Over),
        }
    }
}

impl Index<PolicyObject> for KeptIndex<'_> {
    fn init(&mut self) {
        let _ = self.fit(&Event::Init);
    }

    fn init_apply(&mut self, object: PolicyObject) {
        let _ = self.fit(&Event::InitApply(object));
    }

    fn init_done(&mut self) -> Result<(), Over> {
        self.fit(&Event::InitDone)
    }

    fn apply(&mut self, object: PolicyObject) -> Result<bool, Over> {
        self.fit(&Event::Apply(object)).map(|()| true)
    }

    fn delete(&mut self, object: PolicyObject) -> bool {
        let _ = self.fit(&Event::Delete(object));
        true
    }

    fn changed(&mut self) {
        let _ = self.dirty.try_send(());
    }
}

/// Feeds one reflector and records how its watch is doing; every change marks the state dirty.
pub(super) async fn follow<K>(
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    writer: Writer<K>,
    kind: Kind,
    namespace: &str,
    status: &Mutex<Status>,
    dirty: &mpsc::Sender<()>,
) where
    K: reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let mut index = StoreIndex { writer, dirty };
    // A store has no bounds: the stream runs until it ends.
    let _ = Watch::new(kind, namespace, status)
        .drive(stream, &mut index)
        .await;
}

/// A reflector's store, as an index: every change marks the state dirty.
struct StoreIndex<'a, K>
where
    K: reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer: Writer<K>,
    dirty: &'a mpsc::Sender<()>,
}

impl<K> Index<K> for StoreIndex<'_, K>
where
    K: reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn init(&mut self) {
        self.writer.apply_watcher_event(&Event::Init);
    }

    fn init_apply(&mut self, object: K) {
        self.writer.apply_watcher_event(&Event::InitApply(object));
    }

    fn init_done(&mut self) -> Result<(), Over> {
        self.writer.apply_watcher_event(&Event::InitDone);
        Ok(())
    }

    fn apply(&mut self, object: K) -> Result<bool, Over> {
        self.writer.apply_watcher_event(&Event::Apply(object));
        Ok(true)
    }

    fn delete(&mut self, object: K) -> bool {
        self.writer.apply_watcher_event(&Event::Delete(object));
        true
    }

    fn changed(&mut self) {
        let _ = self.dirty.try_send(());
    }
}

/// The index went past its bounds: it keeps nothing, and its watch stops.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) struct Over;

/// What one watch keeps up to date, and who hears of its changes.
pub(super) trait Index<K> {
    /// A list starts: what it gives replaces everything once it is done.
    fn init(&mut self);
    /// One object of the list in progress.
    fn init_apply(&mut self, object: K);
    /// The list is complete: its objects are the index now.
    fn init_done(&mut self) -> Result<(), Over>;
    /// An object was added or changed; true when the index changed.
    fn apply(&mut self, object: K) -> Result<bool, Over>;
    /// An object was deleted; true when the index changed.
    fn delete(&mut self, object: K) -> bool;
    /// The watch failed, before its health is recorded.
    fn failed(&mut self, _error: &watcher::Error) {}
    /// Tells the index's followers that it changed.
    fn changed(&mut self);
    /// Tells the index's followers that the kind's health changed (listed, or unavailable):
    /// by default as a change.
    fn health_changed(&mut self) {
        self.changed();
    }
}

/// One kind's watch: where its health is kept, and whether it is failing now.
pub(super) struct Watch<'a> {
    kind: Kind,
    namespace: &'a str,
    status: &'a Mutex<Status>,
    /// In a bout of passing trouble (said once per bout).
    failing: bool,
}

impl<'a> Watch<'a> {
    pub(super) fn new(kind: Kind, namespace: &'a str, status: &'a Mutex<Status>) -> Self {
        Watch {
            kind,
            namespace,
            status,
            failing: false,
        }
    }

    /// Applies one item of the watch stream to `index` and records how the watch is doing.
    /// `Err(Over)`: the index went past its bounds, and the stream is to be dropped.
    pub(super) fn step<K>(
        &mut self,
        item: Result<Event<K>, watcher::Error>,
        index: &mut impl Index<K>,
    ) -> Result<(), Over> {
        match item {
            Ok(Event::Init) => index.init(),
            Ok(Event::InitApply(object)) => index.init_apply(object),
            Ok(Event::InitDone) => {
                index.init_done()?;
                watch_synced(self.kind, self.namespace, self.status);
                self.failing = false;
                index.health_changed();
            }
            Ok(Event::Apply(object)) => {
                if index.apply(object)? {
                    index.changed();
                }
            }
            Ok(Event::Delete(object)) => {
                if index.delete(object) {
                    index.changed();
                }
            }
            Err(e) => {
                index.failed(&e);
                if watch_failed(
                    &e,
                    self.kind,
                    self.namespace,
                    self.status,
                    &mut self.failing,
                ) {
                    index.health_changed();
                }
            }
        }
        Ok(())
    }

    /// Drives `index` with `stream` until the stream ends (`Ok`) or the index goes past its
    /// bounds (`Err(Over)`).
    pub(super) async fn drive<K>(
        mut self,
        stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
        index: &mut impl Index<K>,
    ) -> Result<(), Over> {
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            self.step(item, index)?;
        }
        Ok(())
    }
}

/// Records a watch error: a 404 or 403 makes the kind unavailable (said once); other trouble
/// passes (said once per bout). True when the kind's health changed.
fn watch_failed(
    e: &watcher::Error,
    kind: Kind,
    namespace: &str,
    status: &Mutex<Status>,
    failing: &mut bool,
) -> bool {
    match unavailable(e) {
        Some(why) => {
            let was = set_health(status, kind, Health::Unavailable(why));
            if was != Health::Unavailable(why) {
                let what = kind.describe(namespace);
                match why {
                    Unavailable::NotFound => {
                        tracing::warn!(%what, "not found (is the CRD installed?); retrying in the background")
                    }
                    Unavailable::Forbidden => {
                        tracing::warn!(%what, "forbidden by RBAC; retrying in the background")
                    }
                    Unavailable::TooMany => {}
                }
            }
            was != Health::Unavailable(why)
        }
        None => {
            // Passing trouble (a dropped connection, an expired resourceVersion): the
            // watcher recovers by itself; say so once per bout.
            if !*failing {
                tracing::warn!(what = %kind.describe(namespace), error = %e, "watch interrupted; retrying");
                *failing = true;
            }
            false
        }
    }
}

/// The list is complete: the kind is synced (said when it was unavailable before).
fn watch_synced(kind: Kind, namespace: &str, status: &Mutex<Status>) {
    let was = set_health(status, kind, Health::Synced);
    if let Health::Unavailable(_) = was {
        tracing::info!(what = %kind.describe(namespace), "now readable");
    }
}

pub(super) fn health(status: &Mutex<Status>, kind: Kind) -> Health {
    let mut s = status.lock().unwrap_or_else(|e| e.into_inner());
    kind.health(&mut s).clone()
}

pub(super) fn set_health(status: &Mutex<Status>, kind: Kind, health: Health) -> Health {
    let mut s = status.lock().unwrap_or_else(|e| e.into_inner());
    std::mem::replace(kind.health(&mut s), health)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_watch_is_retried_within_seconds_and_from_the_start_once_it_works() {
        use kube::runtime::utils::Backoff;
        let mut retry = Retry::default();
        let floor: Vec<u64> = (0..6)
            .map(|_| retry.next().unwrap().as_millis() as u64)
            .collect();
        for (got, base) in floor.iter().zip([500, 1000, 2000, 4000, 5000, 5000]) {
            assert!(
                (base..base + 250).contains(got),
                "{floor:?}: each pause is its base plus under 250 ms of jitter"
            );
        }
        retry.reset();
        assert!(retry.next().unwrap() < Duration::from_millis(750));
    }
}
