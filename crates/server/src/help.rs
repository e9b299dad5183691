//! HELP texts for the exported metrics, from `docs/metrics.md` (compiled
//! in): each table row `| `name` | type | labels | meaning |` describes its
//! metric, so the documentation and the scrape say the same thing.

const DOC: &str = include_str!("../../../docs/metrics.md");

/// One documented metric: (name, type, meaning).
pub fn documented() -> impl Iterator<Item = (&'static str, &'static str, String)> {
    DOC.lines().filter_map(|line| {
        let cells = cells(line.strip_prefix('|')?);
        let name = cells.first()?.strip_prefix('`')?.strip_suffix('`')?;
        if !name.starts_with("rokka_") || cells.len() < 4 {
            return None;
        }
        Some((name, cells[1], cells[3].replace("\\|", "|").replace('`', "")))
    })
}

/// A table row's cells (`\|` inside a cell is not a separator).
fn cells(row: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut prev) = (0, ' ');
    for (i, c) in row.char_indices() {
        if c == '|' && prev != '\\' {
            out.push(row[start..i].trim());
            start = i + 1;
        }
        prev = c;
    }
    out
}

/// Describes every documented metric to the installed recorder.
pub fn describe_all() {
    for (name, kind, help) in documented() {
        match kind {
            "counter" => metrics::describe_counter!(name, help),
            "gauge" => metrics::describe_gauge!(name, help),
            "histogram" => metrics::describe_histogram!(name, help),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::documented;

    #[test]
    fn every_documented_metric_has_a_type_a_meaning_and_a_conventional_name() {
        let all: Vec<_> = documented().collect();
        assert!(all.len() > 100, "the tables were read: {}", all.len());
        let mut seen = std::collections::HashSet::new();
        for (name, kind, help) in &all {
            assert!(seen.insert(*name), "{name} documented twice");
            assert!(
                matches!(*kind, "counter" | "gauge" | "histogram"),
                "{name}: type {kind}"
            );
            assert!(!help.is_empty(), "{name} has no meaning");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{name}: not a Prometheus name"
            );
            // Prometheus conventions: counters end in _total, durations are
            // seconds and sizes bytes (no _ms, _kb ...).
            assert_eq!(*kind == "counter", name.ends_with("_total"), "{name} ({kind})");
            for unit in ["_ms", "_millis", "_micros", "_kb", "_kib", "_mb", "_mib"] {
                assert!(!name.contains(unit), "{name}: use base units");
            }
        }
    }
}
