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
                // Rebuild when HEAD moves: HEAD itself, the branch's loose ref, packed refs.
                // Only paths that exist are named: cargo takes a missing one as changed and
                // would rebuild the crate on every call. Packing the refs deletes the loose
                // ref (a change cargo sees), and a branch with no loose ref lives in
                // packed-refs, so what moves HEAD is watched either way.
                let mut paths = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
                if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    paths.push(branch);
                }
                for path in paths {
                    if let Some(p) = git(&["rev-parse", "--git-path", &path])
                        && std::path::Path::new(&p).exists()
                    {
                        println!("cargo:rerun-if-changed={p}");
                    }
                }
                commit
            }
            None => "unknown".to_owned(),
        },
    };
    println!("cargo:rustc-env=GDG_GIT_COMMIT={commit}");
}
