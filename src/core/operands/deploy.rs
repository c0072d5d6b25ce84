//! Deploy labels as a node carries them: finding them among its labels, what a request changes
//! of them, whether the node is a GPU node, and the known key nearest a mistyped one.

use super::{
    DEPLOY_PREFIX, GPU_PRESENT_KEY, Labels, NFD_NVIDIA_PCI_KEYS, OPERANDS, OPERANDS_KEY, Operand,
};

/// A deploy-label key that is neither the operands switch nor any operand's label.
pub fn is_unknown_deploy_key(key: &str) -> bool {
    key.starts_with(DEPLOY_PREFIX) && key != OPERANDS_KEY && Operand::from_key(key).is_none()
}

/// The deploy labels among these labels, in key order, found without looking at the others.
pub fn deploy_labels(labels: &Labels) -> impl Iterator<Item = (&String, &String)> {
    use std::ops::Bound;
    labels
        .range::<str, _>((Bound::Included(DEPLOY_PREFIX), Bound::Unbounded))
        .take_while(|(k, _)| k.starts_with(DEPLOY_PREFIX))
}

/// A deploy label whose value a request changes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LabelChange<'a> {
    pub key: &'a str,
    /// Its value before the request; `None` when absent (or for CREATE).
    pub old: Option<&'a str>,
    /// Its value after; `None` when the request removes it.
    pub new: Option<&'a str>,
}

/// The deploy labels whose value differs between `old` (`None` for CREATE: no labels) and
/// `new`, in key order: one walk over both label maps' deploy labels.
pub fn changed_deploy_labels<'a>(old: Option<&'a Labels>, new: &'a Labels) -> Vec<LabelChange<'a>> {
    use std::cmp::Ordering;
    let mut out = Vec::new();
    let mut olds = old.into_iter().flat_map(deploy_labels).peekable();
    let mut news = deploy_labels(new).peekable();
    loop {
        let order = match (olds.peek(), news.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((o, _)), Some((n, _))) => o.cmp(n),
        };
        let change = match order {
            Ordering::Less => olds.next().map(|(k, v)| (k, Some(v), None)),
            Ordering::Greater => news.next().map(|(k, v)| (k, None, Some(v))),
            Ordering::Equal => match (olds.next(), news.next()) {
                (Some((k, o)), Some((_, n))) if o != n => Some((k, Some(o), Some(n))),
                _ => None,
            },
        };
        if let Some((key, old, new)) = change {
            out.push(LabelChange {
                key,
                old: old.map(String::as_str),
                new: new.map(String::as_str),
            });
        }
    }
    out
}

/// Whether the operator treats the node as a GPU node (and so manages its deploy labels).
pub fn is_gpu_node(labels: &Labels) -> bool {
    labels.get(GPU_PRESENT_KEY).map(String::as_str) == Some("true")
        || NFD_NVIDIA_PCI_KEYS
            .iter()
            .any(|k| labels.get(*k).map(String::as_str) == Some("true"))
}

/// The known deploy-label suffix closest to an unknown one, for a did-you-mean hint.
pub fn closest_known(suffix: &str) -> Option<&'static str> {
    // A label name has at most 63 characters; a longer one matches nothing, and the distance
    // would cost time in the square of its length.
    if suffix.len() > 63 {
        return None;
    }
    let candidates = OPERANDS
        .iter()
        .map(|i| &i.key[DEPLOY_PREFIX.len()..])
        .chain(std::iter::once("operands"));
    candidates
        .map(|name| (strsim::jaro_winkler(suffix, name), name))
        .filter(|(score, _)| *score >= 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_a_suggestion() {
        assert_eq!(closest_known("container-tookit"), Some("container-toolkit"));
        assert_eq!(closest_known("device-plugins"), Some("device-plugin"));
        assert_eq!(closest_known("dcgm-exportr"), Some("dcgm-exporter"));
        assert_eq!(closest_known("zzzz"), None);
    }

    #[test]
    fn gpu_node_is_recognised_by_operator_or_nfd_label() {
        let mut labels = Labels::new();
        assert!(!is_gpu_node(&labels));
        labels.insert(GPU_PRESENT_KEY.into(), "false".into());
        assert!(!is_gpu_node(&labels));
        labels.insert(NFD_NVIDIA_PCI_KEYS[1].into(), "true".into());
        assert!(is_gpu_node(&labels));
    }

    #[test]
    fn changed_deploy_labels_are_the_differences_in_key_order() {
        let l = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let d = |s: &str| format!("{DEPLOY_PREFIX}{s}");
        let old = l(&[
            (&d("dcgm"), "true"),
            (&d("device-plugin"), "true"),
            (&d("driver"), "true"),
            ("nvidia.com/gpu.present", "true"),
            ("zz/other", "a"),
        ]);
        let new = l(&[
            (&d("container-toolkit"), "false"),
            (&d("device-plugin"), "true"),
            (&d("driver"), ""),
            ("nvidia.com/gpu.present", "false"),
        ]);
        let got: Vec<(String, Option<&str>, Option<&str>)> =
            changed_deploy_labels(Some(&old), &new)
                .into_iter()
                .map(|c| (c.key.to_owned(), c.old, c.new))
                .collect();
        assert_eq!(
            got,
            [
                (d("container-toolkit"), None, Some("false")),
                (d("dcgm"), Some("true"), None),
                (d("driver"), Some("true"), Some("")),
            ]
        );
        // CREATE: every deploy label is written.
        let created: Vec<&str> = changed_deploy_labels(None, &new)
            .iter()
            .map(|c| c.key)
            .collect();
        assert_eq!(created.len(), 3);
        assert!(changed_deploy_labels(Some(&old), &old).is_empty());
    }
}
