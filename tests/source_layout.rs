//! The shape of the source, held by a test so that it does not drift back:
//!
//! - no import circle between files: the files of `src/` (a module and the modules nested in
//!   it count as one unit) depend on each other through the paths they name (`use` trees and
//!   `crate::`/`super::` paths in code), and those dependencies form no cycle;
//! - `core` does no I/O: none of its files names an I/O or async crate.
//!
//! Test modules (`#[cfg(test)]` and `tests.rs` files) are left out: a test may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A source file, as the module path it defines.
struct Source {
    module: Vec<String>,
    /// The code before its tests, comments removed.
    code: String,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` is `a::b`, `src/a/mod.rs` is `a`, `src/lib.rs` the crate itself.
fn module_of(path: &Path) -> Vec<String> {
    let rel = path.strip_prefix(root()).unwrap().with_extension("");
    let mut segs: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if segs.last().is_some_and(|s| s == "mod" || s == "lib") {
        segs.pop();
    }
    segs
}

/// The code before the file's test module, without comments (doc links name paths too, but
/// they are not dependencies).
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with("#[cfg(test)]") && lines.peek().is_some_and(|l| l.starts_with("mod ")) {
            break;
        }
        let code = match line.find("//") {
            // A `//` inside a string ("https://...") is kept: only a line comment's is cut.
            Some(at) if line[..at].matches('"').count() % 2 == 0 => &line[..at],
            _ => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

fn sources() -> Vec<Source> {
    let mut paths = Vec::new();
    files(&root(), &mut paths);
    paths
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n != "tests.rs" && n != "main.rs")
        })
        .map(|p| Source {
            module: module_of(&p),
            code: code_of(&std::fs::read_to_string(&p).unwrap()),
        })
        .collect()
}

/// Expands the tree of one `use` statement (`a::{b, c::{d, e}}`) into whole paths.
fn expand(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    match tree.find('{') {
        None => {
            for part in tree.split(',') {
                let part = part.split(" as ").next().unwrap().trim();
                if !part.is_empty() {
                    out.push(format!("{prefix}{part}"));
                }
            }
        }
        Some(open) => {
            let head = &tree[..open];
            let Some(close) = tree.rfind('}').filter(|c| *c > open) else {
                panic!("a use tree without its closing brace: {tree}");
            };
            let inner = &tree[open + 1..close];
            // Split the inner list at top-level commas.
            let mut depth = 0;
            let mut start = 0;
            let mut parts = Vec::new();
            for (i, ch) in inner.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        parts.push(&inner[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            parts.push(&inner[start..]);
            for part in parts {
                expand(part, &format!("{prefix}{head}"), out);
            }
        }
    }
}

/// Every path the code names: the trees of its `use` statements and the `crate::`/`super::`
/// paths in its body.
fn paths_named(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = code.lines();
    while let Some(line) = lines.next() {
        let line = line.trim_start();
        let line = match line.strip_prefix("pub") {
            Some(rest) if rest.starts_with('(') => rest.split_once(')').map_or("", |(_, r)| r),
            Some(rest) => rest,
            None => line,
        };
        let Some(tree) = line.trim_start().strip_prefix("use ") else {
            continue;
        };
        let mut tree = tree.to_owned();
        while !tree.contains(';') {
            match lines.next() {
                Some(more) => tree.push_str(more),
                None => break,
            }
        }
        let end = tree.find(';').unwrap_or(tree.len());
        expand(&tree[..end], "", &mut out);
    }
    let bytes = code.as_bytes();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start) {
            let at = from + at;
            from = at + start.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let end = code[at..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| at + e);
            out.push(code[at..end].trim_end_matches(':').to_owned());
        }
    }
    out
}

/// The module path a written path names, from the module `at` it is written in: `crate::` and
/// `super::` resolved; a path starting elsewhere names an outside crate or a child (`None`).
fn absolute(path: &str, at: &[String]) -> Option<Vec<String>> {
    let mut segs = path.split("::").map(str::trim).filter(|s| !s.is_empty());
    let first = segs.next()?;
    let mut base: Vec<String> = match first {
        "crate" => Vec::new(),
        "super" | "self" => {
            // A `mod.rs` (or `lib.rs`) file is its module; another file is a module inside its
            // directory's: `super` from `a/b.rs` is `a`.
            let mut here = at.to_vec();
            if first == "super" {
                here.pop();
            }
            here
        }
        _ => return None,
    };
    for seg in segs {
        match seg {
            "super" => {
                base.pop();
            }
            "self" => {}
            s => base.push(s.to_owned()),
        }
    }
    Some(base)
}

/// The file (as its module) that defines the longest known prefix of `path`.
fn file_of<'m>(path: &[String], modules: &'m BTreeSet<Vec<String>>) -> Option<&'m Vec<String>> {
    (0..=path.len())
        .rev()
        .find_map(|n| modules.get(&path[..n].to_vec()))
}

fn nested(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The files each file depends on, leaving out a module's own nesting.
fn graph(sources: &[Source]) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|s| s.module.clone()).collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for source in sources {
        let deps = edges.entry(source.module.clone()).or_default();
        for path in paths_named(&source.code) {
            let Some(abs) = absolute(&path, &source.module) else {
                continue;
            };
            if let Some(file) = file_of(&abs, &modules)
                && !nested(file, &source.module)
            {
                deps.insert(file.clone());
            }
        }
    }
    edges
}

fn name(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_owned()
    } else {
        module.join("::")
    }
}

/// Strongly connected components of more than one file (Tarjan's algorithm).
fn circles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    struct State<'g> {
        edges: &'g BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'g Vec<String>, usize>,
        low: BTreeMap<&'g Vec<String>, usize>,
        stack: Vec<&'g Vec<String>>,
        on_stack: BTreeSet<&'g Vec<String>>,
        found: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g Vec<String>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            let Some((w, _)) = s.edges.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(name(w));
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let edges = graph(&sources());
    let found = circles(&edges);
    let shown: Vec<String> = found
        .iter()
        .map(|c| {
            let members: BTreeSet<&String> = c.iter().collect();
            let links: Vec<String> = edges
                .iter()
                .filter(|(from, _)| members.contains(&name(from)))
                .flat_map(|(from, to)| {
                    to.iter()
                        .filter(|t| members.contains(&name(t)))
                        .map(move |t| format!("{} -> {}", name(from), name(t)))
                })
                .collect();
            format!("{}\n    {}", c.join(", "), links.join("\n    "))
        })
        .collect();
    assert!(
        found.is_empty(),
        "import circles between files:\n{}",
        shown.join("\n")
    );
}

/// The checker itself: a circle it is shown is one it finds, nesting is not a circle.
#[test]
fn the_checker_sees_a_circle_and_not_a_nesting() {
    let src = |m: &str, code: &str| Source {
        module: m.split("::").map(str::to_owned).collect(),
        code: code_of(code),
    };
    let circle = [
        src("a::x", "use crate::a::y::{One, two::Three};\n"),
        src("a::y", "fn f() { super::x::go() }\n"),
        src("a::y::two", "use super::One; // use crate::a::x\n"),
    ];
    let found = circles(&graph(&circle));
    assert_eq!(found, vec![vec!["a::x".to_owned(), "a::y".to_owned()]]);

    let nesting = [
        src("b", "mod c;\nuse c::Thing;\n"),
        src("b::c", "use super::Other;\n"),
        src(
            "d",
            "// use crate::b;\n#[cfg(test)]\nmod tests {\nuse crate::b;\n}\n",
        ),
    ];
    assert!(circles(&graph(&nesting)).is_empty());
}

/// `core` is the decision: pure, no I/O. A file there naming an I/O or async crate is a
/// mistake of layering, whatever it does with it.
#[test]
fn core_names_no_io_crate() {
    const IO: [&str; 10] = [
        "tokio", "kube", "hyper", "axum", "reqwest", "rustls", "std::fs", "std::net", "std::io",
        "tracing",
    ];
    let mut found = Vec::new();
    for source in sources()
        .iter()
        .filter(|s| s.module.first().is_some_and(|m| m == "core"))
    {
        for path in paths_named(&source.code) {
            if IO
                .iter()
                .any(|io| path == *io || path.starts_with(&format!("{io}::")))
            {
                found.push(format!("{}: {path}", name(&source.module)));
            }
        }
        for io in IO {
            if source.code.contains(&format!("{io}::")) && !io.starts_with("std") {
                found.push(format!("{}: {io}::", name(&source.module)));
            }
        }
    }
    found.dedup();
    assert!(found.is_empty(), "I/O in core: {found:?}");
}

/// The lines of a file before its test module.
fn lines_before_tests(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .position(|w| w[0].starts_with("#[cfg(test)]") && w[1].starts_with("mod "))
        .unwrap_or(lines.len())
}

/// Every function of `text` longer than `limit` lines, from its `fn` line to its closing brace,
/// as `(name, first line, lines)`. rustfmt's layout is relied on: a body closes with a `}` at
/// the indentation of its `fn`, and a signature ends with `{` (a body) or `;` (none).
fn long_functions(text: &str, limit: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let indent = &line[..line.len() - code.len()];
        let Some(name) = fn_name(code) else { continue };
        let mut end = at;
        while end < lines.len() && !lines[end].ends_with('{') && !lines[end].ends_with(';') {
            end += 1;
        }
        if end == lines.len() || lines[end].ends_with(';') || lines[end].ends_with('}') {
            continue;
        }
        let Some(close) = lines[end + 1..].iter().position(|l| {
            l.strip_prefix(indent)
                .is_some_and(|rest| rest.starts_with('}'))
        }) else {
            continue;
        };
        let length = end + 1 + close - at + 1;
        if length > limit {
            out.push((name, at + 1, length));
        }
    }
    out
}

/// The name a line declares a function by (`pub(crate) async fn name<T>(`), if it does.
fn fn_name(code: &str) -> Option<String> {
    let mut rest = code;
    if let Some(after) = rest.strip_prefix("pub") {
        rest = match after.strip_prefix('(') {
            Some(scope) => scope.split_once(')')?.1,
            None => after,
        }
        .trim_start();
    }
    for qualifier in ["const ", "async ", "unsafe ", "extern \"C\" "] {
        rest = rest.strip_prefix(qualifier).unwrap_or(rest);
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(name[..end].to_owned())
}

#[test]
fn no_file_is_over_600_lines_before_its_tests() {
    let mut paths = Vec::new();
    files(&root(), &mut paths);
    let long: Vec<String> = paths
        .iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "tests.rs"))
        .filter_map(|p| {
            let lines = lines_before_tests(&std::fs::read_to_string(p).unwrap());
            (lines > 600).then(|| format!("{}: {lines} lines", p.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "over 600 lines before the tests:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_function_is_over_100_lines() {
    let mut paths = Vec::new();
    files(&root(), &mut paths);
    files(&root().with_file_name("tests"), &mut paths);
    let long: Vec<String> = paths
        .iter()
        .flat_map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            long_functions(&text, 100)
                .into_iter()
                .map(move |(name, line, n)| format!("{}:{line}: {name}, {n} lines", p.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "functions over 100 lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_checker_measures_a_function_from_fn_to_its_brace() {
    let body = "        x();\n".repeat(3);
    let text = format!(
        "impl A {{\n    pub(crate) async fn long<T>(\n        a: T,\n    ) -> T\n    where\n        T: Copy,\n    {{\n{body}    }}\n\n    fn declared(&self);\n    fn short() {{}}\n}}\n"
    );
    assert_eq!(long_functions(&text, 5), vec![("long".to_owned(), 2, 10)]);
    assert!(long_functions(&text, 10).is_empty());
    assert_eq!(fn_name("pub fn a_b(x: u8) {"), Some("a_b".to_owned()));
    assert_eq!(fn_name("let f = fn_like;"), None);
    assert_eq!(
        lines_before_tests("a\nb\n#[cfg(test)]\nmod tests {\n}\n"),
        2
    );
}
