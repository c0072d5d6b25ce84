//! Families that keep one series per group (the source holding the most of a pool, the source
//! refused last for its share): the series is replaced, never doubled.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// Replaces the one series of `family` that `current` records for a group (`same`) with `new`:
/// the new one is set before the old one goes, so no scrape finds none.
pub(crate) fn replace_series<L>(
    family: &Family<L, Gauge>,
    current: &Mutex<Vec<L>>,
    same: impl Fn(&L) -> bool,
    new: Option<(L, usize)>,
) where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
{
    let mut current = current.lock().unwrap_or_else(|e| e.into_inner());
    let old = current.iter().position(&same).map(|i| current.remove(i));
    let new = new.map(|(labels, n)| {
        family
            .get_or_create(&labels)
            .set(i64::try_from(n).unwrap_or(i64::MAX));
        labels
    });
    if let Some(old) = old
        && Some(&old) != new.as_ref()
    {
        family.remove(&old);
    }
    current.extend(new);
}
