//! The connection-URL tables of the README and of the crate docs agree with the code: each
//! row lists every parameter its scheme accepts, nothing else, each at the default the code
//! gives it.

// Helpers outside `#[test]` functions are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use distlock::BackendConfig;

/// Each scheme whose row lists its parameters, and a URL of it without any.
const SCHEMES: &[(&str, &str)] = &[
    ("memory", "memory://"),
    ("zk", "zk://h"),
    ("redis", "redis://h"),
    ("redlock", "redlock://a,b,c"),
    ("etcd", "etcd://h"),
    ("postgres", "postgres://h/db"),
];

/// The value written for a parameter without a default.
const NO_DEFAULT: &str = "PATH";

/// The rows of the URL table of `text` (a Markdown table, in Rust docs or not).
fn rows(text: &str) -> impl Iterator<Item = &str> {
    let lines = text
        .lines()
        .map(|line| line.trim_start().trim_start_matches("//!").trim_start());
    lines
        .skip_while(|line| !line.starts_with("| scheme | form | parameters"))
        .take_while(|line| line.starts_with('|'))
        .filter(|line| line.starts_with("| `"))
}

/// The `name=value` code spans in the last cell of the row of `scheme`.
fn listed(text: &str, scheme: &str) -> Vec<(String, String)> {
    let first = format!("| `{scheme}`");
    let matching: Vec<&str> = rows(text).filter(|row| row.starts_with(&first)).collect();
    let [row] = matching[..] else {
        panic!("{} rows for {scheme}", matching.len());
    };
    let cells: Vec<&str> = row.trim_end_matches('|').split(" | ").collect();
    let last = cells.last().copied().unwrap_or_default();
    let spans = last.split('`').skip(1).step_by(2);
    let params = spans.filter_map(|span| span.split_once('='));
    let named = |(name, _): &(&str, &str)| name.chars().all(|c| c.is_ascii_lowercase() || c == '_');
    params
        .filter(named)
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// The parameters the scheme of `base` accepts, as its error for an unknown one lists them.
fn known(base: &str) -> Vec<String> {
    let error = BackendConfig::from_url(&format!("{base}?not_a_parameter=1"))
        .expect_err("an unknown parameter is refused")
        .to_string();
    let (_, list) = error
        .split_once("(known: ")
        .unwrap_or_else(|| panic!("{base}: {error}"));
    let end = list.find([')', ';']).unwrap_or(list.len());
    list[..end].split(", ").map(str::to_owned).collect()
}

fn check(text: &str, table: &str) {
    for (scheme, base) in SCHEMES {
        let mut listed = listed(text, scheme);
        let default = BackendConfig::from_url(base).unwrap_or_else(|e| panic!("{base}: {e}"));
        for (name, value) in &listed {
            if value == NO_DEFAULT {
                continue;
            }
            let url = format!("{base}?{name}={value}");
            let given = BackendConfig::from_url(&url).map_err(|e| e.to_string());
            assert_eq!(
                given.as_ref(),
                Ok(&default),
                "{table}, {scheme}: {name}={value} is not the default"
            );
        }
        let mut known = known(base);
        listed.sort();
        known.sort();
        let names: Vec<String> = listed.into_iter().map(|(name, _)| name).collect();
        assert_eq!(names, known, "{table}, {scheme}: listed, and accepted");
    }
}

#[test]
fn the_readme_lists_every_parameter_at_its_default() {
    check(include_str!("../../README.md"), "README");
}

#[test]
fn the_crate_docs_list_every_parameter_at_their_defaults() {
    check(include_str!("../src/lib.rs"), "crate docs");
}
