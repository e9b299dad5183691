//! Consumer groups, protocol-neutral at the core. This crate holds the Kafka
//! classic group coordinator as an explicit state machine: every method takes
//! the current time (`now`, in ms of any monotonic clock) and returns the
//! responses it produces, so each transition is tested as a table of
//! (state, event) → (state, responses) without sockets or timers.
//!
//! States (Kafka's `ClassicGroupState`; `shared/protocols/kafka-notes.md`):
//!
//! * **Empty** — no members (may still hold committed offsets). A join
//!   starts a rebalance (after the initial delay); sync/heartbeat/leave →
//!   UNKNOWN_MEMBER_ID.
//! * **PreparingRebalance** — collecting (re)joins. Joins are parked until
//!   every known member has rejoined or the rebalance timeout passes (members
//!   that did not rejoin are removed); heartbeats and syncs →
//!   REBALANCE_IN_PROGRESS. A member's join while its earlier one is parked
//!   takes its place, and the earlier one is answered REBALANCE_IN_PROGRESS.
//! * **CompletingRebalance** — waiting for the leader's SyncGroup; follower
//!   syncs are parked (a member's sync while its earlier one is parked
//!   answers the earlier one REBALANCE_IN_PROGRESS); heartbeats answered
//!   normally.
//! * **Stable** — assignment in force; a leader join, a changed-metadata join,
//!   a leave or a member failure starts a rebalance.
//! * **Dead** — being removed (after DeleteGroups).

pub mod consumer;
mod coordinator;
mod types;

pub use coordinator::{GroupConfig, GroupCoordinator, GroupRecords};
pub use types::*;

#[cfg(test)]
mod tests;
