//! Requests, responses and views of the coordinator.

use bytes::Bytes;

/// Error codes the coordinator answers with (Kafka's numbering).
pub mod code {
    pub const NONE: i16 = 0;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const NOT_COORDINATOR: i16 = 16;
    pub const ILLEGAL_GENERATION: i16 = 22;
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    pub const INVALID_GROUP_ID: i16 = 24;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const INVALID_SESSION_TIMEOUT: i16 = 26;
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    pub const NON_EMPTY_GROUP: i16 = 68;
    pub const GROUP_ID_NOT_FOUND: i16 = 69;
    pub const MEMBER_ID_REQUIRED: i16 = 79;
    pub const GROUP_MAX_SIZE_REACHED: i16 = 81;
    pub const FENCED_INSTANCE_ID: i16 = 82;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl GroupState {
    /// The name Kafka's DescribeGroups/ListGroups use.
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// Identifies a parked request so its response can be routed back.
pub type Token = u64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinRequest {
    pub group: String,
    /// Empty on a member's first join.
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: u64,
    pub rebalance_timeout_ms: u64,
    pub protocol_type: String,
    /// (protocol name, metadata) in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a dynamic member's first join gets MEMBER_ID_REQUIRED.
    pub require_known_member_id: bool,
    /// JoinGroup v9+: the answer may tell the leader to skip the
    /// assignment (a static member's return that changes nothing).
    pub skip_assignment_supported: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JoinResponse {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// (member id, instance id, metadata) — for the leader only.
    pub members: Vec<(String, Option<String>, Bytes)>,
    /// JoinGroup v9+: the leader need not assign (the group keeps its
    /// assignment).
    pub skip_assignment: bool,
    /// The group's record changed with this answer (a static member's
    /// new id): answered once the set's replicas hold it.
    pub durable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRequest {
    pub group: String,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    /// The leader's assignment: (member id, assignment).
    pub assignments: Vec<(String, Bytes)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SyncResponse {
    pub error: i16,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

/// A response released by an event, for a request parked earlier (or now).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Join(Token, JoinResponse),
    Sync(Token, SyncResponse),
}

impl Reply {
    pub fn token(&self) -> Token {
        match self {
            Reply::Join(t, _) | Reply::Sync(t, _) => *t,
        }
    }
}

/// A member as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// A group as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView {
    pub name: String,
    pub state: GroupState,
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub leader: String,
    pub members: Vec<MemberView>,
}
