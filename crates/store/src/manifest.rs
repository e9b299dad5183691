//! `queues.json`: every ConsumeQueue's end offset as of the last checkpoint,
//! and the topics deleted since (with the CommitLog end at deletion).
//!
//! ConsumeQueues are derived data, but nothing in them says a queue is
//! shorter than it should be: zeroed tail entries or a deleted queue
//! directory look like a valid shorter (or new) queue, which would hide
//! messages and hand their offsets out again. At open, each queue must
//! reach at least the end recorded here; if one does not, the queues are
//! rebuilt from the CommitLog (records of deleted topics written before
//! their deletion are not brought back).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::checkpoint::write_atomically;
use crate::error::{Result, StoreError};

pub const FILE: &str = "queues.json";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// "topic/queue" → end offset (the next offset to be assigned).
    pub queues: BTreeMap<String, u64>,
    /// Deleted topic → CommitLog end when it was deleted.
    pub deleted: BTreeMap<String, u64>,
}

impl Manifest {
    /// The manifest in `dir`; `None` when there is none yet or it cannot
    /// be read as one (then nothing is checked: warn and go on).
    pub fn load(dir: &Path) -> Option<Manifest> {
        let path = dir.join(FILE);
        match std::fs::read(&path) {
            Ok(b) => match serde_json::from_slice(&b) {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "queue manifest unreadable: not checked");
                    None
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "queue manifest unreadable: not checked");
                None
            }
        }
    }

    /// Whether `dir` holds a manifest file (readable or not).
    pub fn exists(dir: &Path) -> bool {
        dir.join(FILE).exists()
    }

    pub fn store(&self, dir: &Path) -> Result<()> {
        let data = serde_json::to_vec(self).map_err(|e| StoreError::Config(format!("queue manifest: {e}")))?;
        write_atomically(&dir.join(FILE), &data)
    }

    pub fn key(topic: &str, queue: u32) -> String {
        format!("{topic}/{queue}")
    }

    /// Splits a "topic/queue" key.
    pub fn parse_key(key: &str) -> Option<(&str, u32)> {
        let (t, q) = key.rsplit_once('/')?;
        Some((t, q.parse().ok()?))
    }
}
