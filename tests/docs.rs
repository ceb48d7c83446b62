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

/// The prose of a page: paragraphs and list items (a block each), without code blocks,
/// headings and tables; code spans become one word, links their text.
fn prose_blocks(text: &str) -> Vec<String> {
    let mut blocks: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut fenced = false;
    let flush = |current: &mut String, blocks: &mut Vec<String>| {
        if !current.trim().is_empty() {
            blocks.push(std::mem::take(current));
        }
        current.clear();
    };
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            fenced = !fenced;
            flush(&mut current, &mut blocks);
            continue;
        }
        if fenced || trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('|') {
            flush(&mut current, &mut blocks);
            continue;
        }
        let item = trimmed.strip_prefix("- ").or_else(|| trimmed.strip_prefix("* ")).or_else(|| {
            let digits = trimmed.chars().take_while(char::is_ascii_digit).count();
            (digits > 0).then(|| trimmed[digits..].strip_prefix(". ")).flatten()
        });
        if let Some(item) = item {
            flush(&mut current, &mut blocks);
            current.push_str(item);
        } else {
            current.push(' ');
            current.push_str(trimmed);
        }
    }
    flush(&mut current, &mut blocks);
    blocks.iter().map(|b| plain(b)).collect()
}

/// A code span as one word, a link as its text.
fn plain(block: &str) -> String {
    let mut out = String::new();
    for (i, part) in block.split('`').enumerate() {
        if i % 2 == 1 {
            out.push_str("CODE");
            continue;
        }
        let mut rest = part;
        while let Some(at) = rest.find("](") {
            out.push_str(&rest[..at]);
            let after = &rest[at + 2..];
            match after.find(')') {
                Some(end) => rest = &after[end + 1..],
                None => {
                    rest = after;
                    break;
                }
            }
        }
        out.push_str(rest);
    }
    out.replace('[', "")
}

/// Sentences end at `.`, `?` or `!` followed by a space (or the block's end).
fn sentences(block: &str) -> Vec<usize> {
    let mut words = Vec::new();
    let mut count = 0;
    for word in block.split_whitespace() {
        count += 1;
        if word.ends_with(['.', '?', '!']) || word.ends_with(".)") || word.ends_with(".*") {
            words.push(count);
            count = 0;
        }
    }
    if count > 2 {
        words.push(count);
    }
    words
}

const MAX_SENTENCE_WORDS: usize = 55;
const MAX_AVERAGE_WORDS: f64 = 22.0;
const MAX_CELL_CHARS: usize = 250;

/// What makes a page hard to read: sentences over MAX_SENTENCE_WORDS words, an average
/// over MAX_AVERAGE_WORDS, table cells over MAX_CELL_CHARS characters.
fn hard_to_read(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut all = Vec::new();
    for block in prose_blocks(text) {
        let lengths = sentences(&block);
        let mut words = block.split_whitespace();
        for n in &lengths {
            let sentence: Vec<&str> = words.by_ref().take(*n).collect();
            if *n > MAX_SENTENCE_WORDS {
                let start: Vec<&str> = sentence.iter().take(12).copied().collect();
                found.push(format!("a sentence of {n} words: \"{} …\"", start.join(" ")));
            }
        }
        all.extend(lengths);
    }
    if !all.is_empty() {
        let average = all.iter().sum::<usize>() as f64 / all.len() as f64;
        if average > MAX_AVERAGE_WORDS {
            found.push(format!("an average sentence of {average:.1} words"));
        }
    }
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('|') {
            for cell in line.split('|') {
                if cell.chars().count() > MAX_CELL_CHARS {
                    found.push(format!(
                        "a table cell of {} characters: \"{} …\"",
                        cell.chars().count(),
                        cell.chars().take(60).collect::<String>().trim()
                    ));
                }
            }
        }
    }
    found
}

#[test]
fn the_docs_are_written_in_short_sentences() {
    // docs/cli.md is clap's help, generated: its own test keeps it.
    let mut found = Vec::new();
    let mut read = 0;
    for page in pages().iter().filter(|p| !p.ends_with("docs/cli.md")) {
        read += 1;
        for f in hard_to_read(&std::fs::read_to_string(page).unwrap()) {
            found.push(format!("{}: {f}", page.strip_prefix(root()).unwrap().display()));
        }
    }
    assert!(read >= 10, "only {read} pages read");
    assert!(found.is_empty(), "hard to read (split the sentence, or make it a list):\n{}", found.join("\n"));
}

#[test]
fn the_reader_finds_a_long_sentence_a_long_average_and_a_long_cell() {
    let long = vec!["word"; 60].join(" ");
    let medium = vec!["word"; 30].join(" ");
    let text = format!(
        "# Title\n\nShort one. `a b c d e f` is [one link](x.md#y) here.\n\n- {long}.\n\n```\n{long}\n```\n\n| a | {} |\n",
        "x".repeat(300)
    );
    let found = hard_to_read(&text);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].starts_with("a sentence of 60 words"), "{found:?}");
    assert!(found[1].starts_with("an average sentence of 22.3"), "{found:?}");
    assert!(found[2].starts_with("a table cell of 302"), "{found:?}");
    assert_eq!(sentences(&plain("Short one. `a b c d e f` is [one link](x.md#y) here.")), [2, 5]);
    assert!(hard_to_read(&format!("{medium}. Two words.")).is_empty(), "an average of 16 is fine");
}
