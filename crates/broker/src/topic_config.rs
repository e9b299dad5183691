//! Per-topic configuration (Kafka's topic configs): which names exist,
//! which values are valid, what each is by default, and which of them
//! Rokka acts on. Overrides are kept in the topic table (`topics.json`).
//!
//! Enforced: `retention.ms` and `retention.bytes` (the topic's log start
//! moves past what they exclude; the shared CommitLog frees the space when
//! its segments expire), `max.message.bytes` (a larger batch is
//! MESSAGE_TOO_LARGE), `compression.type` (batches are recompressed to
//! it), `message.timestamp.type` (LogAppendTime stamps each batch on
//! append), `min.insync.replicas` (above the one replica a broker set has
//! today, acks=all is NOT_ENOUGH_REPLICAS), `cleanup.policy` (`compact`
//! keeps the latest record per key, see `compaction.rs`; `delete` applies
//! retention; both do both) with `delete.retention.ms`,
//! `min.compaction.lag.ms`, `max.compaction.lag.ms` and
//! `min.cleanable.dirty.ratio`. Every other Kafka
//! topic config is accepted and described, and has no effect: it tunes
//! Kafka's own segment files or replication, which Rokka does not have.

use std::collections::BTreeMap;

use rokka_store::StoreConfig;

/// How a config's value is typed (DescribeConfigs v3+ `config_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Boolean = 1,
    String = 2,
    Int = 3,
    Short = 4,
    Long = 5,
    Double = 6,
    List = 7,
}

/// Where a described value comes from (DescribeConfigs `config_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Set on the topic.
    Topic = 1,
    /// Set for this broker by AlterConfigs (resource name = its id).
    DynamicBroker = 2,
    /// Set for every broker by AlterConfigs (resource name "").
    DynamicDefaultBroker = 3,
    /// From `config/rokka.toml` (the broker's static configuration).
    StaticBroker = 4,
    /// Kafka's default.
    Default = 5,
}

/// One topic config Rokka knows.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub name: &'static str,
    pub kind: Kind,
    /// The broker-level name of the same setting (DescribeConfigs synonyms).
    pub broker_name: Option<&'static str>,
    /// Whether Rokka acts on it (else it is only kept and described).
    pub enforced: bool,
}

const fn spec(name: &'static str, kind: Kind, broker_name: Option<&'static str>, enforced: bool) -> Spec {
    Spec {
        name,
        kind,
        broker_name,
        enforced,
    }
}

/// Kafka 4's topic configs (`TopicConfig`), sorted by name.
pub const SPECS: &[Spec] = &[
    spec("cleanup.policy", Kind::List, Some("log.cleanup.policy"), true),
    spec(
        "compression.gzip.level",
        Kind::Int,
        Some("compression.gzip.level"),
        false,
    ),
    spec("compression.lz4.level", Kind::Int, Some("compression.lz4.level"), false),
    spec("compression.type", Kind::String, Some("compression.type"), true),
    spec(
        "compression.zstd.level",
        Kind::Int,
        Some("compression.zstd.level"),
        false,
    ),
    spec(
        "delete.retention.ms",
        Kind::Long,
        Some("log.cleaner.delete.retention.ms"),
        true,
    ),
    spec(
        "file.delete.delay.ms",
        Kind::Long,
        Some("log.segment.delete.delay.ms"),
        false,
    ),
    spec("flush.messages", Kind::Long, Some("log.flush.interval.messages"), false),
    spec("flush.ms", Kind::Long, Some("log.flush.interval.ms"), false),
    spec("follower.replication.throttled.replicas", Kind::List, None, false),
    spec(
        "index.interval.bytes",
        Kind::Int,
        Some("log.index.interval.bytes"),
        false,
    ),
    spec("leader.replication.throttled.replicas", Kind::List, None, false),
    spec(
        "local.retention.bytes",
        Kind::Long,
        Some("log.local.retention.bytes"),
        false,
    ),
    spec("local.retention.ms", Kind::Long, Some("log.local.retention.ms"), false),
    spec(
        "max.compaction.lag.ms",
        Kind::Long,
        Some("log.cleaner.max.compaction.lag.ms"),
        true,
    ),
    spec("max.message.bytes", Kind::Int, Some("message.max.bytes"), true),
    spec("message.downconversion.enable", Kind::Boolean, None, false),
    spec(
        "message.timestamp.after.max.ms",
        Kind::Long,
        Some("log.message.timestamp.after.max.ms"),
        true,
    ),
    spec(
        "message.timestamp.before.max.ms",
        Kind::Long,
        Some("log.message.timestamp.before.max.ms"),
        true,
    ),
    spec(
        "message.timestamp.type",
        Kind::String,
        Some("log.message.timestamp.type"),
        true,
    ),
    spec(
        "min.cleanable.dirty.ratio",
        Kind::Double,
        Some("log.cleaner.min.cleanable.ratio"),
        true,
    ),
    spec(
        "min.compaction.lag.ms",
        Kind::Long,
        Some("log.cleaner.min.compaction.lag.ms"),
        true,
    ),
    spec("min.insync.replicas", Kind::Int, Some("min.insync.replicas"), true),
    spec("preallocate", Kind::Boolean, Some("log.preallocate"), false),
    spec("remote.storage.enable", Kind::Boolean, None, false),
    spec("retention.bytes", Kind::Long, Some("log.retention.bytes"), true),
    spec("retention.ms", Kind::Long, Some("log.retention.ms"), true),
    spec("segment.bytes", Kind::Int, Some("log.segment.bytes"), false),
    spec(
        "segment.index.bytes",
        Kind::Int,
        Some("log.index.size.max.bytes"),
        false,
    ),
    spec("segment.jitter.ms", Kind::Long, Some("log.roll.jitter.ms"), false),
    spec("segment.ms", Kind::Long, Some("log.roll.ms"), false),
    spec(
        "unclean.leader.election.enable",
        Kind::Boolean,
        Some("unclean.leader.election.enable"),
        false,
    ),
];

pub fn spec_of(name: &str) -> Option<&'static Spec> {
    SPECS.iter().find(|s| s.name == name)
}

const CODECS: &[&str] = &["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"];

/// Checks `value` for `name`; the value as stored (trimmed), or why not
/// (Kafka answers INVALID_CONFIG with such a message).
pub fn validate(name: &str, value: &str) -> Result<String, String> {
    let Some(s) = spec_of(name) else {
        return Err(format!("Unknown topic config name: {name}"));
    };
    let v = value.trim();
    let bad = |why: &str| Err(format!("Invalid value {v} for configuration {name}: {why}"));
    match s.kind {
        Kind::Boolean => {
            if !v.eq_ignore_ascii_case("true") && !v.eq_ignore_ascii_case("false") {
                return bad("Expected value to be either true or false");
            }
            // No tiered storage here: said, not pretended (Kafka's message
            // for a broker with it off).
            if name == "remote.storage.enable" && v.eq_ignore_ascii_case("true") {
                return Err(
                    "Tiered Storage functionality is disabled in the broker. Topic cannot be configured with remote log storage."
                        .to_string(),
                );
            }
            return Ok(v.to_ascii_lowercase());
        }
        Kind::Int | Kind::Short => {
            let Ok(n) = v.parse::<i32>() else {
                return bad("Not a number of type INT");
            };
            // Kafka's LogConfig ranges.
            let range = match name {
                "min.insync.replicas" | "segment.bytes" => (1, i32::MAX),
                // Records.LOG_OVERHEAD.
                "segment.index.bytes" => (4, i32::MAX),
                // -1: the codec's default (GzipCompression).
                "compression.gzip.level" if n == -1 => (-1, -1),
                "compression.gzip.level" => (1, 9),
                "compression.lz4.level" => (1, 17),
                "compression.zstd.level" => (-131_072, 22),
                _ => (0, i32::MAX),
            };
            if n < range.0 {
                return bad(&format!("Value must be at least {}", range.0));
            }
            if n > range.1 {
                return bad(&format!("Value must be no more than {}", range.1));
            }
        }
        Kind::Long => {
            let Ok(n) = v.parse::<i64>() else {
                return bad("Not a number of type LONG");
            };
            let min = match name {
                "retention.ms" | "retention.bytes" => -1,
                // -2: as retention.ms / retention.bytes (their default).
                "local.retention.ms" | "local.retention.bytes" => -2,
                "segment.ms" | "max.compaction.lag.ms" | "flush.messages" => 1,
                _ => 0,
            };
            if n < min {
                return bad(&format!("Value must be at least {min}"));
            }
        }
        Kind::Double => {
            if !v.parse::<f64>().is_ok_and(|d| (0.0..=1.0).contains(&d)) {
                return bad("Value must be a number between 0 and 1");
            }
        }
        Kind::String | Kind::List => {}
    }
    match name {
        "compression.type" if !CODECS.contains(&v) => bad(&format!("String must be one of: {}", CODECS.join(", "))),
        "message.timestamp.type" if v != "CreateTime" && v != "LogAppendTime" => {
            bad("String must be one of: CreateTime, LogAppendTime")
        }
        "cleanup.policy" => {
            let items: Vec<&str> = v.split(',').map(str::trim).collect();
            if items.iter().any(|p| *p != "delete" && *p != "compact") || items.is_empty() {
                return bad("String must be one of: compact, delete");
            }
            let mut items = items;
            items.dedup();
            Ok(items.join(","))
        }
        _ => Ok(v.to_string()),
    }
}

/// Validates every (name, value) of a request; the map to store or the
/// first error.
pub fn validate_all<'a>(
    configs: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (name, value) in configs {
        let Some(value) = value else {
            return Err(format!("Null value not supported for topic configs: {name}"));
        };
        out.insert(name.to_string(), validate(name, value)?);
    }
    check_together(&out)?;
    Ok(out)
}

/// The checks of a topic's configs as a whole (each value already
/// checked alone): min.compaction.lag.ms not above max.compaction.lag.ms.
pub fn check_together(configs: &BTreeMap<String, String>) -> Result<(), String> {
    let lag = |k: &str| configs.get(k).and_then(|v| v.parse::<i64>().ok());
    if let (Some(min), Some(max)) = (lag("min.compaction.lag.ms"), lag("max.compaction.lag.ms")) {
        if min > max {
            return Err(format!(
                "conflict topic config setting min.compaction.lag.ms ({min}) > max.compaction.lag.ms ({max})"
            ));
        }
    }
    Ok(())
}

/// The value and source of `name` for a topic without an override:
/// Rokka's static configuration where it has the setting, else Kafka's
/// default.
pub fn default_of(name: &str, store: &StoreConfig) -> (String, Source) {
    // A value the operator left at Rokka's default is reported as the
    // default (as Kafka reports a setting absent from server.properties).
    let dflt = StoreConfig::default();
    let set = |changed: bool| if changed { Source::StaticBroker } else { Source::Default };
    let source = match name {
        "retention.ms" => set(store.retention_hours != dflt.retention_hours),
        "retention.bytes" => set(store.retention_max_bytes != dflt.retention_max_bytes),
        "max.message.bytes" => set(store.max_message_bytes != dflt.max_message_bytes),
        "segment.bytes" => set(store.commitlog_segment_bytes != dflt.commitlog_segment_bytes),
        "preallocate" => set(store.preallocate != dflt.preallocate),
        _ => Source::Default,
    };
    let st = |v: String| (v, source);
    let df = |v: &str| (v.to_string(), Source::Default);
    match name {
        "retention.ms" => st((store.retention_hours * 3_600_000).to_string()),
        "retention.bytes" => st(if store.retention_max_bytes == 0 {
            "-1".into()
        } else {
            store.retention_max_bytes.to_string()
        }),
        "max.message.bytes" => st(store.max_message_bytes.to_string()),
        "segment.bytes" => st(store.commitlog_segment_bytes.to_string()),
        "preallocate" => st(store.preallocate.to_string()),
        "cleanup.policy" => df("delete"),
        "compression.type" => df("producer"),
        "compression.gzip.level" => df("-1"),
        "compression.lz4.level" => df("9"),
        "compression.zstd.level" => df("3"),
        "delete.retention.ms" => df("86400000"),
        "file.delete.delay.ms" => df("60000"),
        "flush.messages" => df("9223372036854775807"),
        "flush.ms" => df("9223372036854775807"),
        "follower.replication.throttled.replicas" | "leader.replication.throttled.replicas" => df(""),
        "index.interval.bytes" => df("4096"),
        "local.retention.bytes" | "local.retention.ms" => df("-2"),
        "max.compaction.lag.ms" => df("9223372036854775807"),
        "message.downconversion.enable" => df("true"),
        "message.timestamp.after.max.ms" | "message.timestamp.before.max.ms" => df("9223372036854775807"),
        "message.timestamp.type" => df("CreateTime"),
        "min.cleanable.dirty.ratio" => df("0.5"),
        "min.compaction.lag.ms" => df("0"),
        "min.insync.replicas" => df("1"),
        "remote.storage.enable" => df("false"),
        "segment.index.bytes" => df("10485760"),
        "segment.jitter.ms" => df("0"),
        "segment.ms" => df("604800000"),
        "unclean.leader.election.enable" => df("false"),
        _ => df(""),
    }
}

/// A topic's effective configs, enforced ones resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Effective {
    /// `cleanup.policy` holds `compact` / `delete`.
    pub compact: bool,
    pub delete: bool,
    /// A tombstone stays this long after it was written.
    pub delete_retention_ms: i64,
    /// Records younger than this are not compacted.
    pub min_compaction_lag_ms: i64,
    /// A dirty record older than this makes a pass due.
    pub max_compaction_lag_ms: i64,
    /// Dirty share of a partition's bytes that makes a pass due.
    pub min_cleanable_dirty_ratio: f64,
    /// Records older than this are past the topic's log start (-1 = kept).
    pub retention_ms: i64,
    /// Bytes a partition keeps at most (-1 = no limit).
    pub retention_bytes: i64,
    pub max_message_bytes: u64,
    /// None = keep the producer's codec; Some(0..=4) = Kafka's codec id.
    pub compression: Option<u8>,
    pub log_append_time: bool,
    pub min_insync_replicas: i32,
    /// A CreateTime record's timestamp may lie at most this far before /
    /// after the append (ms; i64::MAX = no limit).
    pub timestamp_before_max_ms: i64,
    pub timestamp_after_max_ms: i64,
}

impl Effective {
    pub fn resolve(overrides: &BTreeMap<String, String>, store: &StoreConfig) -> Effective {
        Effective::resolve_with(overrides, |name| default_of(name, store).0)
    }

    /// As [`Effective::resolve`], with the value of a config the topic does
    /// not override from `default` (dynamic broker configs, then static).
    pub fn resolve_with(overrides: &BTreeMap<String, String>, default: impl Fn(&str) -> String) -> Effective {
        let get = |name: &str| overrides.get(name).cloned().unwrap_or_else(|| default(name));
        let int = |name: &str, dflt: i64| get(name).parse::<i64>().unwrap_or(dflt);
        let policy = get("cleanup.policy");
        Effective {
            compact: policy.split(',').any(|p| p.trim() == "compact"),
            delete: policy.split(',').any(|p| p.trim() == "delete"),
            delete_retention_ms: int("delete.retention.ms", 86_400_000),
            min_compaction_lag_ms: int("min.compaction.lag.ms", 0),
            max_compaction_lag_ms: int("max.compaction.lag.ms", i64::MAX),
            min_cleanable_dirty_ratio: get("min.cleanable.dirty.ratio").parse().unwrap_or(0.5),
            retention_ms: int("retention.ms", -1),
            retention_bytes: int("retention.bytes", -1),
            max_message_bytes: int("max.message.bytes", i64::from(i32::MAX)).max(0) as u64,
            compression: match get("compression.type").as_str() {
                "uncompressed" => Some(0),
                "gzip" => Some(1),
                "snappy" => Some(2),
                "lz4" => Some(3),
                "zstd" => Some(4),
                _ => None,
            },
            log_append_time: get("message.timestamp.type") == "LogAppendTime",
            min_insync_replicas: int("min.insync.replicas", 1) as i32,
            timestamp_before_max_ms: int("message.timestamp.before.max.ms", i64::MAX),
            timestamp_after_max_ms: int("message.timestamp.after.max.ms", i64::MAX),
        }
    }

    /// Whether a topic with these configs needs its own retention pass
    /// (the store's applies to every topic already).
    pub fn own_retention(&self, store: &StoreConfig) -> bool {
        if self.compact {
            // The store's retention never deletes a compacted topic's clean
            // records: with `delete` too, the topic's own pass applies
            // retention.ms (the store's by default) and retention.bytes.
            return self.delete && (self.retention_ms >= 0 || self.retention_bytes >= 0);
        }
        let global_ms = (store.retention_hours * 3_600_000) as i64;
        (self.retention_ms >= 0 && self.retention_ms < global_ms) || self.retention_bytes >= 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_and_bad_values_are_refused_with_kafkas_words() {
        assert_eq!(validate("retention.ms", " 1000 "), Ok("1000".into()));
        assert!(validate("no.such.config", "1").is_err_and(|e| e.contains("Unknown topic config name")));
        assert!(validate("retention.ms", "soon").is_err());
        assert!(validate("retention.ms", "-2").is_err());
        assert!(validate("compression.type", "brotli").is_err());
        assert_eq!(validate("compression.type", "gzip"), Ok("gzip".into()));
        assert!(validate("message.timestamp.type", "Whenever").is_err());
        assert_eq!(
            validate("cleanup.policy", "compact, delete"),
            Ok("compact,delete".into())
        );
        assert!(validate("cleanup.policy", "compact,shred").is_err());
        assert!(validate("min.cleanable.dirty.ratio", "1.5").is_err());
        assert_eq!(validate("cleanup.policy", "delete"), Ok("delete".into()));
        assert!(validate("min.insync.replicas", "0").is_err());
        assert_eq!(validate("preallocate", "TRUE"), Ok("true".into()));
        assert!(validate_all([("max.message.bytes", None)]).is_err());
    }

    /// Kafka's LogConfig ranges: its own defaults are accepted back (a
    /// described config altered again), what it refuses is refused.
    #[test]
    fn values_are_checked_against_kafkas_ranges() {
        for (name, v) in [
            ("local.retention.ms", "-2"),
            ("local.retention.bytes", "-2"),
            ("compression.gzip.level", "-1"),
            ("compression.gzip.level", "9"),
            ("compression.lz4.level", "17"),
            ("compression.zstd.level", "-131072"),
            ("flush.ms", "0"),
            ("remote.storage.enable", "false"),
        ] {
            assert!(validate(name, v).is_ok(), "{name}={v}");
        }
        for (name, v) in [
            ("local.retention.ms", "-3"),
            ("compression.gzip.level", "0"),
            ("compression.gzip.level", "10"),
            ("compression.lz4.level", "0"),
            ("compression.lz4.level", "18"),
            ("compression.zstd.level", "23"),
            ("segment.ms", "0"),
            ("max.compaction.lag.ms", "0"),
            ("flush.messages", "0"),
            ("segment.index.bytes", "3"),
        ] {
            assert!(validate(name, v).is_err(), "{name}={v}");
        }
        assert!(validate("remote.storage.enable", "true").is_err_and(|e| e.contains("Tiered Storage")));
        assert!(validate_all([
            ("min.compaction.lag.ms", Some("10")),
            ("max.compaction.lag.ms", Some("5"))
        ])
        .is_err_and(|e| e.contains("conflict topic config setting")));
        assert!(validate_all([
            ("min.compaction.lag.ms", Some("5")),
            ("max.compaction.lag.ms", Some("10"))
        ])
        .is_ok());
    }

    #[test]
    fn effective_values_come_from_overrides_then_the_store() {
        let store = StoreConfig::default();
        let mut o = BTreeMap::new();
        let e = Effective::resolve(&o, &store);
        assert_eq!(e.retention_ms, 72 * 3_600_000);
        assert_eq!(e.compression, None);
        assert!(!e.own_retention(&store));
        o.insert("retention.ms".to_string(), "60000".to_string());
        o.insert("compression.type".to_string(), "zstd".to_string());
        o.insert("message.timestamp.type".to_string(), "LogAppendTime".to_string());
        let e = Effective::resolve(&o, &store);
        assert_eq!(
            (e.retention_ms, e.compression, e.log_append_time),
            (60_000, Some(4), true)
        );
        assert!(e.own_retention(&store));
        assert!(SPECS.windows(2).all(|w| w[0].name < w[1].name), "sorted");
    }
}
