//! Product files describe the product for its users and maintainers: the
//! README, ARCHITECTURE, the docs and every source file's comments carry
//! no development narration (numbered work sessions, reviews, tracker
//! references, branch names, a predecessor project's old nickname, dated
//! attempts) and no paths outside the repository; the patterns below say
//! exactly what is caught.

use fancy_regex::Regex;
use std::path::{Path, PathBuf};

/// What a product file must not say, with why.
const FORBIDDEN: &[(&str, &str)] = &[
    (
        r"(?i)\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|previous|next|last|this)\s+stop\b(?!\s+strings?\b)",
        "a numbered work session",
    ),
    (
        r"(?i)\bthe reviewer\b|\bafter (the )?(final )?review\b",
        "a review",
    ),
    (r"(?i)\b(from|in|see) the issue\b", "an issue reference"),
    (
        r"(?i)\bthe seed( runtime| api|'s)\b",
        "\"the seed\" for hf2q",
    ),
    (
        r"(?i)\bstayed on (a )?branch|\bon branch [a-z0-9_-]+",
        "a branch",
    ),
    (
        r"\.\./shared\b|(?<![\w.])/work/",
        "a path outside the repository",
    ),
    (
        r"(?i)\bround \d+ of\b|\b(later|earlier|previous) session\b|\ban earlier run\b",
        "a dated attempt",
    ),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every product file: the top-level docs, `docs/`, and the sources.
fn product_files() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(&root).unwrap_or(&path);
            let skip = rel.starts_with("target")
                || rel.starts_with(".git")
                || rel.starts_with("tests/reference")
                || rel == Path::new("tests/tidy.rs");
            if skip {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            let in_docs = rel.starts_with("docs") && ext == "md";
            if in_docs || matches!(ext, "rs" | "cu" | "metal" | "sh" | "py") {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn product_files_do_not_narrate_development() {
    let rules: Vec<(Regex, &str)> = FORBIDDEN
        .iter()
        .map(|(re, why)| (Regex::new(re).expect("pattern"), *why))
        .collect();
    let mut found = Vec::new();
    let files = product_files();
    assert!(files.len() > 50, "only {} product files found", files.len());
    for path in &files {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for (re, why) in &rules {
                if re.is_match(line).unwrap_or(false) {
                    let rel = path.strip_prefix(root()).unwrap_or(path);
                    found.push(format!(
                        "{}:{}: {why}: {}",
                        rel.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "development narration in product files:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_patterns_catch_what_they_name() {
    let hits = |s: &str| {
        FORBIDDEN
            .iter()
            .any(|(re, _)| Regex::new(re).unwrap().is_match(s).unwrap())
    };
    for bad in [
        "the eleventh stop's gain",
        "measured at the previous stop",
        "after the final review (ec1ac8b)",
        "from the issue",
        "the seed runtime's rule",
        "stayed on branches",
        concat!("see ../", "shared/ref"),
        "in /work/main",
        "round 2 of the kernels",
        "measured in a later session",
    ] {
        assert!(hits(bad), "not caught: {bad}");
    }
    for good in [
        "cut before the first stop string",
        "the seed is printed in every failure",
        "runs ./work/x",
        "stop strings (up to 4)",
        "a saved session's file",
        "the engine's scheduling round",
    ] {
        assert!(!hits(good), "caught wrongly: {good}");
    }
}
