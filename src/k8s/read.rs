//! The one way files are read: a path, or standard input for `-`; JSON when the text starts
//! with `{`, YAML otherwise (kubectl writes both). The readers of a Node, a ClusterPolicy and
//! the configuration file are here; the audit's large List files are streamed by [`super::list`].

use std::io::Read;
use std::path::Path;

use super::cluster_policy::{self, ClusterPolicy, ClusterPolicyError};
use super::node::{self, NodeFileError, NodeView};
use crate::core::config::{Config, ConfigError};

/// How messages name standard input.
pub const STDIN: &str = "standard input";

/// The name a path goes by in messages: [`STDIN`] for `-`.
pub fn display(path: &Path) -> String {
    if is_stdin(path) {
        STDIN.to_owned()
    } else {
        path.display().to_string()
    }
}

fn is_stdin(path: &Path) -> bool {
    path == Path::new("-")
}

/// Opens a file, or standard input for `-`, for streaming.
pub fn open(path: &Path) -> std::io::Result<Box<dyn Read>> {
    if is_stdin(path) {
        return Ok(Box::new(std::io::stdin().lock()));
    }
    Ok(Box::new(std::fs::File::open(path)?))
}

/// The whole text of a file, or of standard input for `-`.
pub fn text(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    open(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// JSON when the text starts with `{`, YAML otherwise; the error is the parser's message.
pub fn json_or_yaml(text: &str) -> Result<serde_json::Value, String> {
    if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| e.to_string())
    } else {
        serde_norway::from_str(text).map_err(|e| e.to_string())
    }
}

/// A Node file (`kubectl get node NAME -o json|yaml`), or standard input for `-`.
pub fn node_file(path: &Path) -> Result<NodeView, NodeFileError> {
    let name = display(path);
    let text = text(path).map_err(|error| NodeFileError::Read {
        source_name: name.clone(),
        error,
    })?;
    node::parse_node(&text, &name)
}

/// A ClusterPolicy file (`kubectl get clusterpolicy -o yaml|json`), or standard input for `-`.
pub fn cluster_policy_file(path: &Path) -> Result<ClusterPolicy, ClusterPolicyError> {
    let text = text(path).map_err(|source| ClusterPolicyError::Read {
        path: path.to_owned(),
        source,
    })?;
    cluster_policy::parse(&text, path)
}

/// The YAML configuration file.
pub fn config_file(path: &Path) -> Result<Config, ConfigError> {
    let text = text(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    Config::parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_config_file_names_the_path() {
        let msg = config_file(Path::new("/nonexistent/gdg.yaml"))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("/nonexistent/gdg.yaml"), "{msg}");
    }
}
