//! Stamps the git commit into the binary for `--version`: GDG_GIT_COMMIT from the
//! environment (a container build passes it, having no .git), else `git rev-parse`, else
//! "unknown" (a source tarball): never a build failure.
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=GDG_GIT_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let commit = match std::env::var("GDG_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => match git(&["rev-parse", "--short=12", "HEAD"]) {
            Some(commit) => {
                // Rebuild when HEAD moves: HEAD itself, the branch it points at, packed refs.
                for path in ["HEAD", "packed-refs"] {
                    if let Some(p) = git(&["rev-parse", "--git-path", path]) {
                        println!("cargo:rerun-if-changed={p}");
                    }
                }
                if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
                    && let Some(p) = git(&["rev-parse", "--git-path", &branch])
                {
                    println!("cargo:rerun-if-changed={p}");
                }
                commit
            }
            None => "unknown".to_owned(),
        },
    };
    println!("cargo:rustc-env=GDG_GIT_COMMIT={commit}");
}
