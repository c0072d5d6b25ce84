//! Reading the audit's input files: the JSON `kubectl get nodes -o json`,
//! `kubectl get pods -n gpu-operator -o json` and (optionally)
//! `kubectl get daemonsets -n gpu-operator -o json` write.
//!
//! A file is read into memory once and parsed in one pass with serde_json's
//! slice reader, which skips the fields the audit does not need without
//! building them. Only when that fails is the file parsed again, tracking the
//! path, so that the error can name the field.

use std::io::Read;
use std::path::Path;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::daemonset::{DaemonSetView, RawDaemonSet};
use crate::node::{NodeView, partial_meta};
use crate::pod::{PodView, RawPod};

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

#[derive(Deserialize)]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
struct ListFile<T> {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    items: Option<Vec<T>>,
}

#[derive(Deserialize)]
struct NodeItem {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default, deserialize_with = "partial_meta")]
    metadata: ObjectMeta,
}

trait Item {
    fn kind(&self) -> Option<&str>;
}

impl Item for NodeItem {
    fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }
}

impl Item for RawPod {
    fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }
}

impl Item for RawDaemonSet {
    fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }
}

/// Reads a file, or standard input for `-`.
pub fn read_bytes(path: &Path, what: &'static str) -> Result<Vec<u8>, FileError> {
    let read_error = |source| FileError::Read {
        what,
        path: display(path),
        source,
    };
    if path == Path::new("-") {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf).map_err(read_error)?;
        Ok(buf)
    } else {
        std::fs::read(path).map_err(read_error)
    }
}

fn display(path: &Path) -> String {
    if path == Path::new("-") {
        "standard input".to_owned()
    } else {
        path.display().to_string()
    }
}

fn parse_list<T: DeserializeOwned + Item>(
    bytes: &[u8],
    path: &Path,
    kind: &ListKind,
) -> Result<Vec<T>, FileError> {
    let list: ListFile<T> = match serde_json::from_slice(bytes) {
        Ok(list) => list,
        Err(e) => return Err(explain(bytes, path, kind, e)),
    };
    let found = list.kind.unwrap_or_default();
    let Some(items) = list.items else {
        let found = if found.is_empty() {
            "an object without `kind` or `items`".to_owned()
        } else {
            format!("a {found}")
        };
        return Err(wrong_kind(path, kind, found));
    };
    if !matches!(found.as_str(), "" | "List") && found != kind.list_kind {
        return Err(wrong_kind(path, kind, format!("a {found}")));
    }
    if let Some((i, other)) = items
        .iter()
        .enumerate()
        .find_map(|(i, item)| item.kind().filter(|k| *k != kind.item_kind).map(|k| (i, k)))
    {
        return Err(wrong_kind(path, kind, format!("a {other} at items[{i}]")));
    }
    Ok(items)
}

fn wrong_kind(path: &Path, kind: &ListKind, found: String) -> FileError {
    FileError::Kind {
        what: kind.what,
        path: display(path),
        expected: match kind.item_kind {
            "Node" => "a List of Nodes",
            "Pod" => "a List of Pods",
            _ => "a List of DaemonSets",
        },
        command: kind.command,
        found,
    }
}

/// Turns a failed fast parse into an error naming the file and, for a type error, the field.
fn explain(bytes: &[u8], path: &Path, kind: &ListKind, e: serde_json::Error) -> FileError {
    if e.is_syntax() || e.is_eof() || e.is_io() {
        return FileError::Syntax {
            what: kind.what,
            path: display(path),
            command: kind.command,
            message: e.to_string(),
        };
    }
    fn tracked<T: DeserializeOwned>(bytes: &[u8]) -> Option<(String, String)> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        match serde_path_to_error::deserialize::<_, ListFile<T>>(&mut de) {
            Ok(_) => None,
            Err(e) => Some((e.path().to_string(), e.into_inner().to_string())),
        }
    }
    let detail = match kind.item_kind {
        "Node" => tracked::<NodeItem>(bytes),
        "Pod" => tracked::<RawPod>(bytes),
        _ => tracked::<RawDaemonSet>(bytes),
    };
    let (field, message) = detail.unwrap_or_else(|| (".".to_owned(), e.to_string()));
    FileError::Field {
        what: kind.what,
        path: display(path),
        field,
        message,
    }
}

/// Nodes from `kubectl get nodes -o json` text.
pub fn parse_nodes(bytes: &[u8], path: &Path) -> Result<Vec<NodeView>, FileError> {
    let items: Vec<NodeItem> = parse_list(bytes, path, &NODES)?;
    Ok(items
        .into_iter()
        .map(|i| NodeView {
            metadata: i.metadata,
        })
        .collect())
}

/// Pods from `kubectl get pods -o json` text.
pub fn parse_pods(bytes: &[u8], path: &Path) -> Result<Vec<PodView>, FileError> {
    let items: Vec<RawPod> = parse_list(bytes, path, &PODS)?;
    Ok(items.into_iter().map(PodView::from).collect())
}

/// DaemonSets from `kubectl get daemonsets -o json` text.
pub fn parse_daemonsets(bytes: &[u8], path: &Path) -> Result<Vec<DaemonSetView>, FileError> {
    let items: Vec<RawDaemonSet> = parse_list(bytes, path, &DAEMONSETS)?;
    Ok(items.into_iter().map(DaemonSetView::from).collect())
}

pub fn read_nodes(path: &Path) -> Result<Vec<NodeView>, FileError> {
    parse_nodes(&read_bytes(path, NODES.what)?, path)
}

pub fn read_pods(path: &Path) -> Result<Vec<PodView>, FileError> {
    parse_pods(&read_bytes(path, PODS.what)?, path)
}

pub fn read_daemonsets(path: &Path) -> Result<Vec<DaemonSetView>, FileError> {
    parse_daemonsets(&read_bytes(path, DAEMONSETS.what)?, path)
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
             expected value at line 1 column 1"
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
