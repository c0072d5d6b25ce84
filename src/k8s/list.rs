//! Reading the audit's input files: the JSON `kubectl get nodes -o json`,
//! `kubectl get pods -n gpu-operator -o json` and (optionally)
//! `kubectl get daemonsets -n gpu-operator -o json` write.
//!
//! A file is streamed: [`split`](super::split) cuts its `items` array into
//! one item at a time, and each is parsed with serde_json's slice parser
//! into a small struct, skipping every field the audit does not need
//! without building it. Memory stays at one chunk and one item besides the
//! result. Only an item that fails is parsed again, tracking the path, so
//! that the error names the field.

use std::io::Read;
use std::path::Path;

use serde::de::DeserializeOwned;

use super::daemonset::{DaemonSetView, RawDaemonSet};
use super::foreign::{AnyDaemonSetView, RawAnyDaemonSet};
use super::node::{NodeFile, NodeView};
use super::pod::{PodView, RawPod};
use super::read;
use super::resource_slice::ResourceSliceView;
use super::split::{SplitError, read_items};

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {what} file {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("{what} file {path} is not valid JSON (expected the output of `{command}`): {message}")]
    Syntax {
        what: &'static str,
        path: String,
        command: &'static str,
        message: String,
    },
    #[error("{what} file {path}: expected {expected} (the output of `{command}`), found {found}")]
    Kind {
        what: &'static str,
        path: String,
        expected: &'static str,
        command: &'static str,
        found: String,
    },
    #[error("{what} file {path}: {field}: {message}")]
    Field {
        what: &'static str,
        path: String,
        field: String,
        message: String,
    },
}

/// What one kind of list file holds.
struct ListKind {
    what: &'static str,
    item_kind: &'static str,
    list_kind: &'static str,
    command: &'static str,
}

const NODES: ListKind = ListKind {
    what: "nodes",
    item_kind: "Node",
    list_kind: "NodeList",
    command: "kubectl get nodes -o json",
};
const PODS: ListKind = ListKind {
    what: "pods",
    item_kind: "Pod",
    list_kind: "PodList",
    command: "kubectl get pods -n gpu-operator -o json",
};
const DAEMONSETS: ListKind = ListKind {
    what: "daemonsets",
    item_kind: "DaemonSet",
    list_kind: "DaemonSetList",
    command: "kubectl get daemonsets -n gpu-operator -o json",
};

const ALL_DAEMONSETS: ListKind = ListKind {
    what: "daemonsets",
    item_kind: "DaemonSet",
    list_kind: "DaemonSetList",
    command: "kubectl get daemonsets -A -o json",
};
const RESOURCE_SLICES: ListKind = ListKind {
    what: "resourceslices",
    item_kind: "ResourceSlice",
    list_kind: "ResourceSliceList",
    command: "kubectl get resourceslices -o json",
};

trait Item {
    fn kind(&self) -> Option<&str>;
}

impl Item for NodeFile {
    fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }
}

impl Item for RawPod {
    fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }
}

/// A slice with its `kind`, as a list file gives it.
#[derive(serde::Deserialize)]
struct RawSlice {
    #[serde(default)]
    kind: Option<String>,
    #[serde(flatten)]
    slice: ResourceSliceView,
}

impl Item for RawSlice {
    fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }
}

impl Item for RawAnyDaemonSet {
    fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }
}

impl Item for RawDaemonSet {
    fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }
}

/// Parses a List's items from `source`, checking each item's and the List's kind.
fn parse_list<T: DeserializeOwned + Item>(
    source: impl Read,
    path: &Path,
    kind: &ListKind,
) -> Result<Vec<T>, FileError> {
    let mut items = Vec::new();
    let outline = read_items(source, |i, item: T| {
        if let Some(other) = item.kind().filter(|k| *k != kind.item_kind) {
            return Err(wrong_kind(path, kind, format!("a {other} at items[{i}]")));
        }
        items.push(item);
        Ok(())
    })?;
    let outline = outline.map_err(|e| match e {
        SplitError::Io(source) => FileError::Read {
            what: kind.what,
            path: read::display(path),
            source,
        },
        SplitError::Syntax { message, at } => FileError::Syntax {
            what: kind.what,
            path: read::display(path),
            command: kind.command,
            message: format!("{message} at {at}"),
        },
        SplitError::Item {
            index,
            field,
            message,
            at,
        } => FileError::Field {
            what: kind.what,
            path: read::display(path),
            field: if field.is_empty() {
                format!("items[{index}]")
            } else {
                format!("items[{index}].{field}")
            },
            message: format!("{message} at {at}"),
        },
    })?;
    let found = outline.kind.unwrap_or_default();
    if !outline.has_items {
        let found = if found.is_empty() {
            "an object without `kind` or `items`".to_owned()
        } else {
            format!("a {found}")
        };
        return Err(wrong_kind(path, kind, found));
    }
    if !matches!(found.as_str(), "" | "List") && found != kind.list_kind {
        return Err(wrong_kind(path, kind, format!("a {found}")));
    }
    Ok(items)
}

fn wrong_kind(path: &Path, kind: &ListKind, found: String) -> FileError {
    FileError::Kind {
        what: kind.what,
        path: read::display(path),
        expected: match kind.item_kind {
            "Node" => "a List of Nodes",
            "Pod" => "a List of Pods",
            "ResourceSlice" => "a List of ResourceSlices",
            _ => "a List of DaemonSets",
        },
        command: kind.command,
        found,
    }
}

/// Nodes from `kubectl get nodes -o json` text; `path` names it in errors.
pub fn parse_nodes(bytes: &[u8], path: &Path) -> Result<Vec<NodeView>, FileError> {
    nodes_from(bytes, path)
}

fn nodes_from(source: impl Read, path: &Path) -> Result<Vec<NodeView>, FileError> {
    let items: Vec<NodeFile> = parse_list(source, path, &NODES)?;
    Ok(items
        .into_iter()
        .map(|i| NodeView {
            metadata: i.metadata,
            placement: i.spec,
            advertised: i.status,
        })
        .collect())
}

/// Pods from `kubectl get pods -o json` text; `path` names it in errors.
pub fn parse_pods(bytes: &[u8], path: &Path) -> Result<Vec<PodView>, FileError> {
    pods_from(bytes, path)
}

fn pods_from(source: impl Read, path: &Path) -> Result<Vec<PodView>, FileError> {
    let items: Vec<RawPod> = parse_list(source, path, &PODS)?;
    Ok(items.into_iter().map(PodView::from).collect())
}

fn daemonsets_from(source: impl Read, path: &Path) -> Result<Vec<DaemonSetView>, FileError> {
    let items: Vec<RawDaemonSet> = parse_list(source, path, &DAEMONSETS)?;
    Ok(items.into_iter().map(DaemonSetView::from).collect())
}

/// Opens a file, or standard input for `-`, and parses it with `parse`.
fn read_with<T>(
    path: &Path,
    kind: &ListKind,
    parse: impl FnOnce(&mut dyn Read) -> Result<T, FileError>,
) -> Result<T, FileError> {
    let mut file = read::open(path).map_err(|source| FileError::Read {
        what: kind.what,
        path: read::display(path),
        source,
    })?;
    parse(&mut file)
}

pub fn read_nodes(path: &Path) -> Result<Vec<NodeView>, FileError> {
    read_with(path, &NODES, |r| nodes_from(r, path))
}

pub fn read_pods(path: &Path) -> Result<Vec<PodView>, FileError> {
    read_with(path, &PODS, |r| pods_from(r, path))
}

/// Both files of a file audit, the (larger) pods file on a second thread: on two cores the
/// nodes come for free.
pub fn read_nodes_and_pods(
    nodes: &Path,
    pods: &Path,
) -> Result<(Vec<NodeView>, Vec<PodView>), FileError> {
    std::thread::scope(|s| {
        let pods = s.spawn(|| read_pods(pods));
        let nodes = read_nodes(nodes);
        let pods = pods
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        Ok((nodes?, pods?))
    })
}

pub fn read_daemonsets(path: &Path) -> Result<Vec<DaemonSetView>, FileError> {
    read_with(path, &DAEMONSETS, |r| daemonsets_from(r, path))
}

/// Every DaemonSet of the cluster (`kubectl get daemonsets -A -o json`), read for the device
/// plugins among them.
pub fn read_all_daemonsets(path: &Path) -> Result<Vec<AnyDaemonSetView>, FileError> {
    read_with(path, &ALL_DAEMONSETS, |r| {
        let items: Vec<RawAnyDaemonSet> = parse_list(r, path, &ALL_DAEMONSETS)?;
        Ok(items.into_iter().map(AnyDaemonSetView::from).collect())
    })
}

/// ResourceSlices from `kubectl get resourceslices -o json`.
pub fn read_resource_slices(path: &Path) -> Result<Vec<ResourceSliceView>, FileError> {
    read_with(path, &RESOURCE_SLICES, |r| {
        let items: Vec<RawSlice> = parse_list(r, path, &RESOURCE_SLICES)?;
        Ok(items.into_iter().map(|i| i.slice).collect())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(text: &str) -> Result<Vec<NodeView>, String> {
        parse_nodes(text.as_bytes(), Path::new("nodes.json")).map_err(|e| e.to_string())
    }

    fn pods(text: &str) -> Result<Vec<PodView>, String> {
        parse_pods(text.as_bytes(), Path::new("pods.json")).map_err(|e| e.to_string())
    }

    #[test]
    fn kubectl_lists_are_read() {
        let n = nodes(
            r#"{"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":""},"items":[
              {"apiVersion":"v1","kind":"Node","metadata":{"name":"a","labels":{"k":"v"}},"status":{"images":[]}},
              {"metadata":{"name":"b"}}]}"#,
        )
        .unwrap();
        assert_eq!(n.len(), 2);
        assert_eq!(n[0].name(), "a");
        assert_eq!(n[0].labels().get("k").map(String::as_str), Some("v"));
        let p = pods(r#"{"kind":"PodList","items":[{"kind":"Pod","metadata":{"name":"p"},"spec":{"nodeName":"a"}}]}"#)
            .unwrap();
        assert_eq!(p[0].node.as_deref(), Some("a"));
        assert!(pods(r#"{"kind":"List","items":[]}"#).unwrap().is_empty());
    }

    #[test]
    fn bad_input_is_an_error_naming_the_file_and_the_problem() {
        assert_eq!(
            nodes(r#"{"kind":"List","items":[{"kind":"Pod","metadata":{"name":"p"}}]}"#)
                .unwrap_err(),
            "nodes file nodes.json: expected a List of Nodes (the output of `kubectl get nodes -o json`), \
             found a Pod at items[0]"
        );
        assert_eq!(
            pods(r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}"#).unwrap_err(),
            "pods file pods.json: expected a List of Pods (the output of `kubectl get pods -n gpu-operator -o json`), \
             found a Pod"
        );
        assert_eq!(
            pods(r#"{"kind":"NodeList","items":[]}"#).unwrap_err(),
            "pods file pods.json: expected a List of Pods (the output of `kubectl get pods -n gpu-operator -o json`), \
             found a NodeList"
        );
        assert_eq!(
            nodes(r#"{"kind":"List","items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b","labels":{"x":1}}}]}"#)
                .unwrap_err(),
            "nodes file nodes.json: items[1].metadata.labels.x: invalid type: integer `1`, expected a string \
             at line 1 column 89"
        );
        assert_eq!(
            pods(r#"{"kind":"List","items":[{"status":{"phase":7}}]}"#).unwrap_err(),
            "pods file pods.json: items[0].status.phase: invalid type: integer `7`, expected a pod phase string \
             at line 1 column 44"
        );
        assert_eq!(
            pods(r#"{"kind":"List","items":[{"metadata":"#).unwrap_err(),
            "pods file pods.json is not valid JSON (expected the output of `kubectl get pods -n gpu-operator -o json`): \
             EOF while parsing a value at line 1 column 36"
        );
        assert_eq!(
            nodes("items: []").unwrap_err(),
            "nodes file nodes.json is not valid JSON (expected the output of `kubectl get nodes -o json`): \
             expected a JSON object at line 1 column 1"
        );
        assert_eq!(
            pods(r#"{"kind":"List","items":[{"metadata" 1}]}"#).unwrap_err(),
            "pods file pods.json is not valid JSON (expected the output of `kubectl get pods -n gpu-operator -o json`): \
             expected `:` at line 1 column 37"
        );
        // Positions are the file's, not the item's.
        assert_eq!(
            nodes("{\n  \"items\": [\n    {\"metadata\": {\"name\": \"a\"}},\n    {\"metadata\": {\n      \"labels\": {\"x\": true}}}\n  ]\n}\n")
                .unwrap_err(),
            "nodes file nodes.json: items[1].metadata.labels.x: invalid type: boolean `true`, expected a string \
             at line 5 column 26"
        );
        let missing = read_pods(Path::new("/nonexistent/pods.json"))
            .unwrap_err()
            .to_string();
        assert!(
            missing.starts_with("cannot read pods file /nonexistent/pods.json: "),
            "{missing}"
        );
    }
}
