//! Metrics read at scrape time: series labelled with something a client
//! names (a group, a topic) exist exactly while that thing does. Kept in
//! the `metrics` recorder instead, a deleted group's gauges would stay
//! forever (gauges are not expired by the recorder's idle timeout, since
//! many are set only when they change) and every name a client ever used
//! would cost memory and scrape time.

use std::fmt::Write;
use std::sync::{Arc, Mutex, PoisonError};

/// One gauge family: name, help, and (labels, value) samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl Family {
    pub fn gauge(name: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            samples: Vec::new(),
        }
    }

    pub fn push(&mut self, labels: Vec<(&'static str, String)>, value: f64) {
        self.samples.push((labels, value));
    }
}

/// Something that reports families at each scrape.
pub trait Collect: Send + Sync {
    fn collect(&self, out: &mut Vec<Family>);
}

/// The collectors the `/metrics` endpoint renders after the recorder's
/// output. Cloned handles share one list, so a collector may be added once
/// the component it reads exists.
#[derive(Clone, Default)]
pub struct Collectors(Arc<Mutex<Vec<Arc<dyn Collect>>>>);

impl std::fmt::Debug for Collectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("Collectors").field("count", &n).finish()
    }
}

impl Collectors {
    pub fn add(&self, c: Arc<dyn Collect>) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(c);
    }

    /// Appends every collector's families to `out` in the Prometheus text
    /// format (0.0.4).
    pub fn render(&self, out: &mut String) {
        let list: Vec<Arc<dyn Collect>> = self.0.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let mut families = Vec::new();
        for c in list {
            c.collect(&mut families);
        }
        for f in families {
            render_family(&f, out);
        }
    }
}

fn render_family(f: &Family, out: &mut String) {
    let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
    let _ = writeln!(out, "# TYPE {} gauge", f.name);
    for (labels, value) in &f.samples {
        out.push_str(f.name);
        if !labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(k);
                out.push_str("=\"");
                escape_into(v, out);
                out.push('"');
            }
            out.push('}');
        }
        let _ = writeln!(out, " {value}");
    }
    out.push('\n');
}

/// Label value escaping of the text format: backslash, quote, newline.
fn escape_into(v: &str, out: &mut String) {
    for ch in v.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Family);
    impl Collect for Fixed {
        fn collect(&self, out: &mut Vec<Family>) {
            out.push(self.0.clone());
        }
    }

    #[test]
    fn families_render_in_the_text_format_with_escaped_labels() {
        let c = Collectors::default();
        let mut f = Family::gauge("rokka_x", "an x");
        f.push(vec![("group", "a\"b\\c\nd".into()), ("queue", "3".into())], 7.0);
        f.push(vec![], 0.5);
        c.add(Arc::new(Fixed(f)));
        let mut out = String::new();
        c.render(&mut out);
        assert_eq!(
            out,
            "# HELP rokka_x an x\n# TYPE rokka_x gauge\nrokka_x{group=\"a\\\"b\\\\c\\nd\",queue=\"3\"} 7\nrokka_x 0.5\n\n"
        );
    }
}
