//! Following one kind of object: the watch stream every kind is read through (retried within
//! seconds, listed again from scratch after a 403 or 404), the GPU-policy objects kept as what
//! the decisions read ([`Following`]), the reflector of the other kinds, and the health each
//! watch records.

use std::sync::Mutex;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector as reflect};
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
const OVER_BOUNDS_PAUSE: Duration = Duration::from_secs(30);

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
        loop {
            let stream = watcher(api.clone(), cfg.clone());
            futures::pin_mut!(stream);
            let mut failing = false;
            loop {
                let Some(item) = stream.next().await else {
                    return;
                };
                let changed = match item {
                    Ok(event) => {
                        if kept.apply(&event, bounds) == Fit::Over {
                            break;
                        }
                        match event {
                            Event::InitDone => {
                                watch_synced(kind, namespace, status);
                                failing = false;
                                true
                            }
                            Event::Apply(_) | Event::Delete(_) => true,
                            Event::Init | Event::InitApply(_) => false,
                        }
                    }
                    Err(e) => watch_failed(&e, kind, namespace, status, &mut failing),
                };
                if changed {
                    let _ = dirty.try_send(());
                }
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

/// Feeds one reflector and records how its watch is doing; every change marks the state dirty.
pub(super) async fn follow<K>(
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    writer: Writer<K>,
    kind: Kind,
    namespace: &str,
    status: &Mutex<Status>,
    dirty: &mpsc::Sender<()>,
) where
    K: reflector::Lookup + Clone,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let stream = reflect(writer, stream);
    futures::pin_mut!(stream);
    let mut failing = false;
    while let Some(item) = stream.next().await {
        let changed = match item {
            Ok(Event::InitDone) => {
                watch_synced(kind, namespace, status);
                failing = false;
                true
            }
            Ok(Event::Apply(_) | Event::Delete(_)) => true,
            Ok(Event::Init | Event::InitApply(_)) => false,
            Err(e) => watch_failed(&e, kind, namespace, status, &mut failing),
        };
        if changed {
            let _ = dirty.try_send(());
        }
    }
}

/// Records a watch error: a 404 or 403 makes the kind unavailable (said once); other trouble
/// passes (said once per bout). True when the kind's health changed.
pub(super) fn watch_failed(
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
pub(super) fn watch_synced(kind: Kind, namespace: &str, status: &Mutex<Status>) {
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
