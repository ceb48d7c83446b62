//! The documentation's links: every relative link in README.md, ARCHITECTURE.md and
//! docs/ names a file of the repository, and every `#anchor` a heading of its page (as
//! GitHub makes them), so moving or renaming a section cannot leave a dead link.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    let mut dirs = vec![root().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// Markdown link targets `](target)` outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Drop code spans: a `](x)` inside backticks is not a link.
        let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchor of a heading: lowercased, punctuation but `-` and `_` dropped, spaces
/// to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(slug(line.trim_start_matches('#')));
        }
    }
    out
}

fn broken_links(page: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(page).unwrap();
    let mut broken = Vec::new();
    for link in links(&text) {
        if link.starts_with("http://") || link.starts_with("https://") || link.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = link.split_once('#').map_or((link.as_str(), None), |(f, a)| (f, Some(a)));
        let target = if file.is_empty() { page.to_path_buf() } else { page.parent().unwrap().join(file) };
        if !target.exists() {
            broken.push(format!("{link}: no such file"));
            continue;
        }
        if let Some(anchor) = anchor {
            let headings = anchors(&std::fs::read_to_string(&target).unwrap_or_default());
            if !headings.iter().any(|h| h == anchor) {
                broken.push(format!("{link}: no such heading"));
            }
        }
    }
    broken
}

#[test]
fn every_link_of_the_docs_names_a_file_and_a_heading_that_exist() {
    let pages = pages();
    assert!(pages.len() >= 10, "docs/ not found: {pages:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        checked += links(&std::fs::read_to_string(page).unwrap()).len();
        for b in broken_links(page) {
            broken.push(format!("{}: {b}", page.strip_prefix(root()).unwrap().display()));
        }
    }
    assert!(checked >= 30, "only {checked} links found: the link reader is broken");
    assert!(broken.is_empty(), "dead links:\n{}", broken.join("\n"));
}

#[test]
fn the_checker_finds_a_dead_file_and_a_dead_anchor() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("a.md");
    std::fs::write(dir.path().join("b.md"), "# B title\n\n## Some section (v2)\n").unwrap();
    std::fs::write(
        &page,
        "[ok](b.md#some-section-v2) [gone](c.md) [bad](b.md#nothing) `[code](x.md)`\n```\n[fenced](y.md)\n```\n",
    )
    .unwrap();
    assert_eq!(broken_links(&page), ["c.md: no such file", "b.md#nothing: no such heading"]);
}

#[test]
fn the_readme_stays_a_front_page() {
    // What it is, try it, run the tests, use, install, a performance headline, links:
    // the rest belongs in docs/.
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines: move detail to docs/ and link it");
    for command in ["examples/demo.sh", "tests/run.sh"] {
        assert!(readme.contains(&format!("```sh\n{command}\n```")), "README.md lost its `{command}` block");
    }
}
