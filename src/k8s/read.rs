//! The one way files are read: a path, or standard input for `-`; JSON when the text starts
//! with `{`, YAML otherwise (kubectl writes both; [`super::document`] tells them apart). The
//! readers of a Node, a ClusterPolicy and the configuration file are here; the audit's large
//! List files are streamed by [`super::list`].

use std::io::{self, Read};
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

/// The largest configuration file read: a real one is a few KiB.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// The YAML configuration file (at most [`MAX_CONFIG_BYTES`], a regular file or standard input).
pub fn config_file(path: &Path) -> Result<Config, ConfigError> {
    let read = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let bytes = if is_stdin(path) {
        let mut bytes = Vec::new();
        io::stdin()
            .lock()
            .take(MAX_CONFIG_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read)?;
        if bytes.len() as u64 > MAX_CONFIG_BYTES {
            return Err(read(too_large(MAX_CONFIG_BYTES)));
        }
        bytes
    } else {
        regular_file(path, MAX_CONFIG_BYTES).map_err(read)?
    };
    let text = String::from_utf8(bytes)
        .map_err(|_| read(io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text")))?;
    Config::parse(&text, path)
}

fn too_large(max: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("larger than the limit of {max} bytes"),
    )
}

/// Reads a file the server depends on: a regular file (symlinks followed, as a mounted
/// Secret's or ConfigMap's `..data` links are) of at most `max` bytes. A FIFO, a device such
/// as `/dev/zero`, a directory or a huge file is refused before it can block the process or
/// grow its memory.
pub fn regular_file(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    // Without O_NONBLOCK, opening a FIFO that has no writer waits forever; on a regular file
    // the flag changes nothing.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, device or directory)",
        ));
    }
    if meta.len() > max {
        return Err(too_large(max));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // Bounded again: the file may grow while it is read.
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large(max));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_is_named() {
        let msg = node_file(std::path::Path::new("/nonexistent/node.json"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("cannot read /nonexistent/node.json"),
            "{msg}"
        );
    }

    #[test]
    fn a_missing_cluster_policy_file_is_named() {
        let missing = cluster_policy_file(Path::new("/nonexistent/cp.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            missing.starts_with("cannot read ClusterPolicy file /nonexistent/cp.yaml: "),
            "{missing}"
        );
    }

    #[test]
    fn a_missing_config_file_names_the_path() {
        let msg = config_file(Path::new("/nonexistent/gdg.yaml"))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("/nonexistent/gdg.yaml"), "{msg}");
    }

    #[test]
    fn only_regular_files_within_the_size_limit_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, b"mode: warn\n").unwrap();
        assert_eq!(regular_file(&small, 64).unwrap(), b"mode: warn\n");
        // Through a symlink, as Kubernetes mounts a ConfigMap's files.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&small, &link).unwrap();
        assert_eq!(regular_file(&link, 64).unwrap(), b"mode: warn\n");

        let msg = regular_file(&small, 4).unwrap_err().to_string();
        assert_eq!(msg, "larger than the limit of 4 bytes");
        for special in [Path::new("/dev/zero"), dir.path()] {
            let msg = regular_file(special, 64).unwrap_err().to_string();
            assert!(
                msg.contains("not a regular file"),
                "{}: {msg}",
                special.display()
            );
        }
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Returns at once instead of waiting for a writer.
        let msg = regular_file(&fifo, 64).unwrap_err().to_string();
        assert!(msg.contains("not a regular file"), "{msg}");
    }

    #[test]
    fn a_config_file_over_one_mib_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.yaml");
        let mut text = "mode: warn\n".to_owned();
        text.push_str(&"#".repeat(MAX_CONFIG_BYTES as usize));
        std::fs::write(&big, text).unwrap();
        let msg = config_file(&big).unwrap_err().to_string();
        assert!(
            msg.contains("big.yaml") && msg.contains("larger than the limit of 1048576 bytes"),
            "{msg}"
        );
    }
}
