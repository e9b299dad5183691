//! KIP-848 consumer groups ("the new consumer rebalance protocol"): the
//! broker computes the assignment and members converge on it by
//! heartbeats, one partition at a time, never two owners at once.
//!
//! * The **group epoch** moves whenever membership, a subscription or a
//!   subscribed topic's partition count changes; the **target assignment**
//!   (uniform or range assignor) is recomputed for it.
//! * Each member has a **member epoch** and reconciles towards the target
//!   (Kafka's `CurrentAssignmentBuilder`): partitions it must give up are
//!   revoked first (it keeps its epoch, state UnrevokedPartitions, until a
//!   heartbeat shows it no longer owns them); partitions another member
//!   still owns wait (state UnreleasedPartitions) until released; then it
//!   takes the target's epoch (state Stable).
//! * A member silent for the session timeout, or not revoking within its
//!   rebalance timeout, is fenced: removed, its partitions freed.
//! * A static member (one with an instance id) that leaves with epoch -2
//!   keeps its place and partitions for its session timeout: the same
//!   instance id joining again takes them over without a rebalance. While
//!   its holder is in the group, the instance id is refused to another
//!   member (UNRELEASED_INSTANCE_ID), and a member it was taken from is
//!   fenced (FENCED_INSTANCE_ID), as in Kafka's GroupMetadataManager.
//!
//! Topics are named here; the frontend maps Kafka topic ids at the edge.
//! Every method takes `now` (ms) and is pure state, like the classic
//! coordinator.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::types::code;

/// Longest topic name (Kafka allows 249; Rokka 255).
const MAX_TOPIC_NAME: usize = 255;

/// (topic, partition).
pub type Tp = (String, u32);

/// The member epoch a static member leaves with (temporarily).
const LEAVE_STATIC_EPOCH: i32 = -2;

/// Longest SubscribedTopicRegex a KIP-848 member may send.
const MAX_REGEX_BYTES: usize = 16 * 1024;

/// Error codes of the consumer protocol (Kafka's numbering).
pub mod err {
    pub const INVALID_REQUEST: i16 = 42;
    pub const FENCED_INSTANCE_ID: i16 = 82;
    pub const INVALID_REGULAR_EXPRESSION: i16 = 121;
    pub const FENCED_MEMBER_EPOCH: i16 = 110;
    pub const UNRELEASED_INSTANCE_ID: i16 = 111;
    pub const UNSUPPORTED_ASSIGNOR: i16 = 112;
    pub const STALE_MEMBER_EPOCH: i16 = 113;
}

/// The assignors served (the first is the default).
pub const ASSIGNORS: [&str; 2] = ["uniform", "range"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    Stable,
    UnrevokedPartitions,
    UnreleasedPartitions,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Stable => "STABLE",
            MemberState::UnrevokedPartitions => "UNREVOKED_PARTITIONS",
            MemberState::UnreleasedPartitions => "UNRELEASED_PARTITIONS",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub epoch: i32,
    pub previous_epoch: i32,
    pub state: MemberState,
    /// Topics it consumes: the names it subscribed to and those its
    /// regular expression matches now.
    pub subscribed: BTreeSet<String>,
    /// The names it subscribed to.
    pub names: BTreeSet<String>,
    /// Its subscription's regular expression (anchored, as Kafka's RE2J
    /// `matches`).
    pub regex: Option<(String, regex::Regex)>,
    pub assignor: Option<String>,
    pub rebalance_timeout_ms: u64,
    /// What the member owns (or is told to own) now.
    pub assigned: BTreeSet<Tp>,
    /// What it must give up before others may take it.
    pub revoking: BTreeSet<Tp>,
    /// Left as a static member (epoch -2): its place and partitions are
    /// kept for its instance id until its session times out.
    pub left: bool,
    last_heartbeat: u64,
    revoke_deadline: Option<u64>,
    /// The assignment last sent, so an unchanged one is not resent.
    sent: Option<BTreeSet<Tp>>,
    /// The topics its regular expression matched, and the version of the
    /// topic table they were matched against (0: not yet): matched again
    /// only when the table changed or the expression did, not on every
    /// heartbeat of every member.
    regex_matches: BTreeSet<String>,
    regex_at: u64,
}

#[derive(Debug, Clone, Default)]
pub struct ConsumerGroup {
    pub name: String,
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub assignor: String,
    pub members: BTreeMap<String, Member>,
    /// Target assignment of `assignment_epoch`.
    pub target: BTreeMap<String, BTreeSet<Tp>>,
    /// Partition counts of the subscribed topics the target was computed for.
    topics: BTreeMap<String, u32>,
}

impl ConsumerGroup {
    /// Kafka's `ConsumerGroupState` names.
    pub fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.assignment_epoch < self.epoch {
            "Assigning"
        } else if self
            .members
            .values()
            .any(|m| m.left || m.epoch != self.assignment_epoch || m.state != MemberState::Stable)
        {
            // (A static member away — left with epoch -2, its place kept —
            // is not reconciled to the target: Kafka's isReconciledTo.)
            "Reconciling"
        } else {
            "Stable"
        }
    }
}

/// A ConsumerGroupHeartbeat, topics by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeartbeatRequest {
    pub group: String,
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    /// -1 = unchanged.
    pub rebalance_timeout_ms: i32,
    /// None = unchanged.
    pub subscribed_topics: Option<Vec<String>>,
    pub subscribed_regex: Option<String>,
    pub server_assignor: Option<String>,
    /// None = unchanged.
    pub owned: Option<Vec<Tp>>,
    pub client_id: String,
    pub client_host: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeartbeatResponse {
    pub error: i16,
    pub message: Option<String>,
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// None = unchanged since the last response.
    pub assignment: Option<Vec<Tp>>,
}

/// Timing and budgets (`[group]` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerConfig {
    pub session_timeout_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub max_size: usize,
    /// Most topic names one member may subscribe to (0 = no limit).
    pub max_subscribed_topics: usize,
}

/// Topic lookups the coordinator needs: a topic's partition count, and
/// every topic's name (for regular-expression subscriptions).
pub trait Topics {
    fn partitions(&self, topic: &str) -> Option<u32>;
    fn names(&self) -> Vec<String> {
        Vec::new()
    }
    /// A number that changes whenever the topics do (0: unknown — regular
    /// expressions are then matched again at every heartbeat).
    fn version(&self) -> u64 {
        0
    }
}

impl<F: Fn(&str) -> Option<u32>> Topics for F {
    fn partitions(&self, topic: &str) -> Option<u32> {
        self(topic)
    }
}

fn fail(error: i16, msg: &str, member_id: &str, epoch: i32) -> HeartbeatResponse {
    HeartbeatResponse {
        error,
        message: Some(msg.to_string()),
        member_id: member_id.to_string(),
        member_epoch: epoch,
        heartbeat_interval_ms: 0,
        assignment: None,
    }
}

/// A consumer group as a coordinator taking over loads it (Kafka keeps
/// the same in `__consumer_offsets`: group epoch, target assignment,
/// members with their epochs, subscriptions and current assignments).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupRecord {
    name: String,
    epoch: i32,
    assignment_epoch: i32,
    assignor: String,
    members: Vec<MemberRecord>,
    target: Vec<(String, Vec<Tp>)>,
    topics: Vec<(String, u32)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MemberRecord {
    id: String,
    instance_id: Option<String>,
    rack_id: Option<String>,
    client_id: String,
    client_host: String,
    epoch: i32,
    previous_epoch: i32,
    state: String,
    subscribed: Vec<String>,
    names: Vec<String>,
    regex: Option<String>,
    assignor: Option<String>,
    rebalance_timeout_ms: u64,
    assigned: Vec<Tp>,
    revoking: Vec<Tp>,
    #[serde(default)]
    left: bool,
}

impl MemberRecord {
    fn of(m: &Member) -> MemberRecord {
        MemberRecord {
            id: m.id.clone(),
            instance_id: m.instance_id.clone(),
            rack_id: m.rack_id.clone(),
            client_id: m.client_id.clone(),
            client_host: m.client_host.clone(),
            epoch: m.epoch,
            previous_epoch: m.previous_epoch,
            state: m.state.name().to_string(),
            subscribed: m.subscribed.iter().cloned().collect(),
            names: m.names.iter().cloned().collect(),
            regex: m.regex.as_ref().map(|(r, _)| r.clone()),
            assignor: m.assignor.clone(),
            rebalance_timeout_ms: m.rebalance_timeout_ms,
            assigned: m.assigned.iter().cloned().collect(),
            revoking: m.revoking.iter().cloned().collect(),
            left: m.left,
        }
    }
}

impl GroupRecord {
    fn of(g: &ConsumerGroup) -> GroupRecord {
        GroupRecord {
            name: g.name.clone(),
            epoch: g.epoch,
            assignment_epoch: g.assignment_epoch,
            assignor: g.assignor.clone(),
            members: g.members.values().map(MemberRecord::of).collect(),
            target: g
                .target
                .iter()
                .map(|(id, tps)| (id.clone(), tps.iter().cloned().collect()))
                .collect(),
            topics: g.topics.iter().map(|(t, n)| (t.clone(), *n)).collect(),
        }
    }

    /// The group as its new coordinator holds it: every member's session
    /// (and a revocation's deadline) starting at `now`; each member is sent
    /// its assignment again at its next heartbeat. A member whose
    /// subscription's expression no longer compiles is left out (it
    /// rejoins).
    fn load(self, now: u64) -> ConsumerGroup {
        let members = self
            .members
            .into_iter()
            .filter_map(|m| {
                let regex = match m.regex {
                    Some(r) => Some((r.clone(), regex::Regex::new(&format!("^(?:{r})$")).ok()?)),
                    None => None,
                };
                let state = match m.state.as_str() {
                    "UNREVOKED_PARTITIONS" => MemberState::UnrevokedPartitions,
                    "UNRELEASED_PARTITIONS" => MemberState::UnreleasedPartitions,
                    _ => MemberState::Stable,
                };
                let revoking: BTreeSet<Tp> = m.revoking.into_iter().collect();
                let member = Member {
                    id: m.id.clone(),
                    instance_id: m.instance_id,
                    rack_id: m.rack_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    epoch: m.epoch,
                    previous_epoch: m.previous_epoch,
                    state,
                    subscribed: m.subscribed.into_iter().collect(),
                    names: m.names.into_iter().collect(),
                    regex,
                    assignor: m.assignor,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    assigned: m.assigned.into_iter().collect(),
                    revoke_deadline: (!revoking.is_empty()).then(|| now + m.rebalance_timeout_ms.max(1)),
                    revoking,
                    left: m.left,
                    last_heartbeat: now,
                    sent: None,
                    regex_matches: BTreeSet::new(),
                    regex_at: 0,
                };
                Some((m.id, member))
            })
            .collect();
        ConsumerGroup {
            name: self.name,
            epoch: self.epoch,
            assignment_epoch: self.assignment_epoch,
            assignor: self.assignor,
            members,
            target: self
                .target
                .into_iter()
                .map(|(id, tps)| (id, tps.into_iter().collect()))
                .collect(),
            topics: self.topics.into_iter().collect(),
        }
    }
}

/// See [`ConsumerGroups::heartbeat_mark`].
#[derive(Debug, PartialEq)]
pub struct HeartbeatMark {
    epoch: i32,
    assignment_epoch: i32,
    members: usize,
    /// The heartbeating member as its record keeps it.
    member: Option<MemberRecord>,
}

/// The consumer groups and their heartbeat logic.
#[derive(Debug, Default)]
pub struct ConsumerGroups {
    pub groups: BTreeMap<String, ConsumerGroup>,
    id_seq: u64,
}

impl ConsumerGroups {
    /// About what every member holds: ids, subscriptions, assignments.
    pub fn member_bytes(&self) -> usize {
        let tps = |s: &BTreeSet<Tp>| s.iter().map(|(t, _)| 32 + t.len()).sum::<usize>();
        self.groups
            .values()
            .flat_map(|g| g.members.values())
            .map(|m| {
                256 + m.id.len()
                    + m.instance_id.as_ref().map_or(0, String::len)
                    + m.rack_id.as_ref().map_or(0, String::len)
                    + m.client_id.len()
                    + m.client_host.len()
                    + m.subscribed.iter().chain(&m.names).map(|t| 32 + t.len()).sum::<usize>()
                    + m.regex.as_ref().map_or(0, |(r, _)| 64 + 4 * r.len())
                    + tps(&m.assigned)
                    + tps(&m.revoking)
            })
            .sum()
    }

    fn new_member_id(&mut self) -> String {
        self.id_seq += 1;
        let r: u64 = rand::random();
        format!("{:016x}-{:08x}", r, self.id_seq)
    }

    /// One heartbeat. `may_create` says whether a new group may be made
    /// (the caller checks names against classic groups and the budget).
    pub fn heartbeat(
        &mut self,
        req: HeartbeatRequest,
        now: u64,
        topics: &dyn Topics,
        config: &ConsumerConfig,
        may_create: bool,
    ) -> HeartbeatResponse {
        if req.group.is_empty() {
            return fail(
                code::INVALID_GROUP_ID,
                "GroupId can't be empty.",
                &req.member_id,
                req.member_epoch,
            );
        }
        let joining = req.member_epoch == 0;
        if joining {
            if req.rebalance_timeout_ms == -1 {
                return fail(
                    err::INVALID_REQUEST,
                    "RebalanceTimeoutMs must be provided in first request.",
                    &req.member_id,
                    0,
                );
            }
            if req.subscribed_topics.is_none() && req.subscribed_regex.is_none() {
                return fail(
                    err::INVALID_REQUEST,
                    "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.",
                    &req.member_id,
                    0,
                );
            }
            if req.owned.as_ref().is_none_or(|o| !o.is_empty()) {
                return fail(
                    err::INVALID_REQUEST,
                    "TopicPartitions must be empty when (re-)joining.",
                    &req.member_id,
                    0,
                );
            }
        } else if req.member_id.is_empty() {
            return fail(err::INVALID_REQUEST, "MemberId can't be empty.", "", req.member_epoch);
        }
        if let Some(a) = &req.server_assignor {
            if !ASSIGNORS.contains(&a.as_str()) {
                return fail(
                    err::UNSUPPORTED_ASSIGNOR,
                    &format!("ServerAssignor {a} is not supported. Supported assignors: uniform, range."),
                    &req.member_id,
                    req.member_epoch,
                );
            }
        }
        // A subscription's regular expression must compile before anything
        // changes (anchored: Kafka matches the whole topic name).
        if req
            .subscribed_topics
            .as_ref()
            .is_some_and(|t| config.max_subscribed_topics > 0 && t.len() > config.max_subscribed_topics)
        {
            return fail(
                err::INVALID_REQUEST,
                &format!("more than {} subscribed topic names", config.max_subscribed_topics),
                &req.member_id,
                req.member_epoch,
            );
        }
        // The member's regular expression as it stands: compiled again only
        // when the member sends another.
        let current = self
            .groups
            .get(&req.group)
            .and_then(|g| g.members.get(&req.member_id))
            .and_then(|m| m.regex.clone());
        let compiled = match req.subscribed_regex.as_deref() {
            Some(re) if current.as_ref().is_some_and(|(s, _)| s == re) => current,
            // Compiled under the coordinator's lock: a pattern is bounded
            // in length (the regex crate bounds what it compiles to).
            Some(re) if re.len() > MAX_REGEX_BYTES => {
                return fail(
                    err::INVALID_REGULAR_EXPRESSION,
                    &format!("SubscribedTopicRegex is longer than {MAX_REGEX_BYTES} bytes."),
                    &req.member_id,
                    req.member_epoch,
                )
            }
            Some(re) if !re.is_empty() => match regex::Regex::new(&format!("^(?:{re})$")) {
                Ok(r) => Some((re.to_string(), r)),
                Err(e) => {
                    return fail(
                        err::INVALID_REGULAR_EXPRESSION,
                        &format!("SubscribedTopicRegex `{re}` is not a valid regular expression: {e}."),
                        &req.member_id,
                        req.member_epoch,
                    )
                }
            },
            _ => None,
        };
        // Leaving: -1 (dynamic), -2 (static, temporarily: the member keeps
        // its place and partitions for its instance id until its session
        // times out).
        if req.member_epoch < 0 {
            if let Some(g) = self.groups.get_mut(&req.group) {
                let stays = req.member_epoch == LEAVE_STATIC_EPOCH
                    && g.members.get(&req.member_id).is_some_and(|m| m.instance_id.is_some());
                if stays {
                    if let Some(m) = g.members.get_mut(&req.member_id) {
                        m.left = true;
                        m.last_heartbeat = now;
                        // What it was still giving up is free at once
                        // (Kafka clears the pending revocation).
                        m.revoking.clear();
                        m.revoke_deadline = None;
                        if m.state == MemberState::UnrevokedPartitions {
                            m.state = MemberState::Stable;
                        }
                    }
                } else if g.members.remove(&req.member_id).is_some() {
                    g.epoch += 1;
                    g.target.remove(&req.member_id);
                }
            }
            return HeartbeatResponse {
                member_id: req.member_id,
                member_epoch: req.member_epoch,
                ..HeartbeatResponse::default()
            };
        }
        if !self.groups.contains_key(&req.group) {
            if !joining {
                return fail(
                    code::UNKNOWN_MEMBER_ID,
                    "unknown member",
                    &req.member_id,
                    req.member_epoch,
                );
            }
            if !may_create {
                return fail(code::COORDINATOR_NOT_AVAILABLE, "too many groups", &req.member_id, 0);
            }
            self.groups.insert(
                req.group.clone(),
                ConsumerGroup {
                    name: req.group.clone(),
                    assignor: ASSIGNORS[0].to_string(),
                    ..ConsumerGroup::default()
                },
            );
        }
        let member_id = if req.member_id.is_empty() {
            self.new_member_id()
        } else {
            req.member_id.clone()
        };
        let Some(g) = self.groups.get_mut(&req.group) else {
            return fail(code::COORDINATOR_NOT_AVAILABLE, "group vanished", &member_id, 0);
        };
        // Anything that changes the group moves its epoch, once.
        let mut bump = joining;
        // The member: new on epoch 0, else known with a matching epoch.
        if joining {
            if !g.members.contains_key(&member_id) && config.max_size > 0 && g.members.len() >= config.max_size {
                return fail(
                    code::GROUP_MAX_SIZE_REACHED,
                    "The consumer group has reached its maximum capacity.",
                    &member_id,
                    0,
                );
            }
            // A static member joining: the instance id must be free, or
            // held by a member that left with epoch -2, whose place and
            // partitions the new member takes over.
            let mut replaced = None;
            if let Some(inst) = &req.instance_id {
                // (Its own id counts when it left: a client that keeps its
                // member id subscribes again.)
                let holder = g
                    .members
                    .values()
                    .find(|m| m.instance_id.as_ref() == Some(inst) && (m.id != member_id || m.left));
                match holder {
                    Some(h) if !h.left => {
                        return fail(
                            err::UNRELEASED_INSTANCE_ID,
                            &format!(
                                "Static member {member_id} with instance id {inst} cannot join the group \
                                 because the instance id is owned by {} member.",
                                h.id
                            ),
                            &member_id,
                            0,
                        );
                    }
                    Some(h) => {
                        let old = h.id.clone();
                        replaced = g.members.remove(&old).map(|m| (m, g.target.remove(&old)));
                    }
                    None => {}
                }
            }
            let rejoin = g.members.remove(&member_id).is_some();
            if let Some((mut m, target)) = replaced {
                // The place as it was: epoch, partitions, subscription; the
                // group's epoch does not move unless the subscription does.
                m.id.clone_from(&member_id);
                m.left = false;
                m.rack_id.clone_from(&req.rack_id);
                m.client_id.clone_from(&req.client_id);
                m.client_host.clone_from(&req.client_host);
                m.rebalance_timeout_ms = req.rebalance_timeout_ms.max(0) as u64;
                m.last_heartbeat = now;
                m.sent = None;
                // The new process owns nothing yet: what the target no
                // longer gives this member is free at once, not revoked.
                if let Some(t) = &target {
                    m.assigned.retain(|tp| t.contains(tp));
                }
                m.revoking.clear();
                m.revoke_deadline = None;
                if m.state == MemberState::UnrevokedPartitions {
                    m.state = MemberState::Stable;
                }
                g.members.insert(member_id.clone(), m);
                if let Some(t) = target {
                    g.target.insert(member_id.clone(), t);
                }
                bump = false;
            } else {
                g.members.insert(
                    member_id.clone(),
                    Member {
                        id: member_id.clone(),
                        instance_id: req.instance_id.clone(),
                        rack_id: req.rack_id.clone(),
                        client_id: req.client_id.clone(),
                        client_host: req.client_host.clone(),
                        epoch: 0,
                        previous_epoch: 0,
                        state: MemberState::Stable,
                        subscribed: BTreeSet::new(),
                        names: BTreeSet::new(),
                        regex: None,
                        assignor: None,
                        rebalance_timeout_ms: req.rebalance_timeout_ms.max(0) as u64,
                        assigned: BTreeSet::new(),
                        revoking: BTreeSet::new(),
                        left: false,
                        last_heartbeat: now,
                        revoke_deadline: None,
                        sent: None,
                        regex_matches: BTreeSet::new(),
                        regex_at: 0,
                    },
                );
                if rejoin {
                    g.target.remove(&member_id);
                }
            }
        } else {
            // A static member's instance id taken over by another member
            // fences this one.
            if let Some(inst) = &req.instance_id {
                if let Some(h) = g
                    .members
                    .values()
                    .find(|m| m.instance_id.as_ref() == Some(inst) && m.id != member_id)
                {
                    return fail(
                        err::FENCED_INSTANCE_ID,
                        &format!(
                            "Static member {member_id} with instance id {inst} was fenced by member {}.",
                            h.id
                        ),
                        &member_id,
                        req.member_epoch,
                    );
                }
            }
            let Some(m) = g.members.get(&member_id) else {
                return fail(
                    code::UNKNOWN_MEMBER_ID,
                    &format!("Member {member_id} is not a member of group {}.", req.group),
                    &member_id,
                    req.member_epoch,
                );
            };
            let lost_response = req.member_epoch == m.previous_epoch
                && req
                    .owned
                    .as_ref()
                    .is_some_and(|o| o.iter().all(|tp| m.assigned.contains(tp)));
            if m.left || (req.member_epoch != m.epoch && !lost_response) {
                return fail(
                    err::FENCED_MEMBER_EPOCH,
                    &format!("The member epoch {} does not match {}.", req.member_epoch, m.epoch),
                    &member_id,
                    req.member_epoch,
                );
            }
        }
        let Some(m) = g.members.get_mut(&member_id) else {
            return fail(code::UNKNOWN_MEMBER_ID, "unknown member", &member_id, req.member_epoch);
        };
        m.last_heartbeat = now;
        if req.rebalance_timeout_ms >= 0 {
            m.rebalance_timeout_ms = req.rebalance_timeout_ms as u64;
        }
        if let Some(t) = &req.subscribed_topics {
            // (A name no topic can have — longer than a topic name may be —
            // is not kept.)
            m.names = t.iter().filter(|n| n.len() <= MAX_TOPIC_NAME).cloned().collect();
        }
        if req.subscribed_regex.is_some() {
            m.regex = compiled;
        }
        // Every member's topics now: this member's, and those of members
        // with a regular expression (it may match topics created since
        // their last heartbeat). The others' are as they were — not
        // recomputed (a copy of every member's names per heartbeat).
        let version = topics.version();
        let regex_sent = req.subscribed_regex.is_some();
        let stale = |id: &str, mm: &Member| {
            mm.regex.is_some() && (version == 0 || mm.regex_at != version || (id == member_id && regex_sent))
        };
        let all_names = if g.members.iter().any(|(id, mm)| stale(id, mm)) {
            topics.names()
        } else {
            Vec::new()
        };
        for (id, mm) in g.members.iter_mut() {
            let refresh = stale(id, mm);
            if *id != member_id && !refresh {
                continue;
            }
            match &mm.regex {
                Some((_, re)) if refresh => {
                    mm.regex_matches = all_names.iter().filter(|n| re.is_match(n)).cloned().collect();
                    mm.regex_at = version;
                }
                Some(_) => {}
                None => mm.regex_matches.clear(),
            }
            let mut subs = mm.names.clone();
            subs.extend(mm.regex_matches.iter().cloned());
            if subs != mm.subscribed {
                mm.subscribed = subs;
                bump = true;
            }
        }
        let Some(m) = g.members.get_mut(&member_id) else {
            return fail(code::UNKNOWN_MEMBER_ID, "unknown member", &member_id, req.member_epoch);
        };
        if req.server_assignor.is_some() && req.server_assignor != m.assignor {
            m.assignor.clone_from(&req.server_assignor);
            bump = true;
        }
        // The group's subscribed topics as they are now.
        let wanted: BTreeSet<&str> = g
            .members
            .values()
            .flat_map(|m| m.subscribed.iter().map(String::as_str))
            .collect();
        let metadata: BTreeMap<String, u32> = wanted
            .iter()
            .filter_map(|t| topics.partitions(t).map(|n| (t.to_string(), n)))
            .collect();
        if metadata != g.topics {
            g.topics = metadata;
            bump = true;
        }
        if bump {
            g.epoch += 1;
        }
        if g.assignment_epoch < g.epoch {
            // The assignor most members prefer, else the default.
            let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
            for mm in g.members.values() {
                if let Some(a) = &mm.assignor {
                    *votes.entry(a.as_str()).or_default() += 1;
                }
            }
            g.assignor = votes
                .iter()
                .max_by_key(|(_, n)| **n)
                .map_or(ASSIGNORS[0], |(a, _)| *a)
                .to_string();
            let target = assign(&g.assignor, g, &g.target);
            g.target = target;
            g.assignment_epoch = g.epoch;
        }
        reconcile(g, &member_id, req.owned.as_deref(), now);
        let Some(m) = g.members.get_mut(&member_id) else {
            return fail(code::UNKNOWN_MEMBER_ID, "unknown member", &member_id, req.member_epoch);
        };
        let owned_differs = req
            .owned
            .as_ref()
            .is_some_and(|o| o.iter().cloned().collect::<BTreeSet<Tp>>() != m.assigned);
        let assignment = if joining || owned_differs || m.sent.as_ref() != Some(&m.assigned) {
            m.sent = Some(m.assigned.clone());
            Some(m.assigned.iter().cloned().collect())
        } else {
            None
        };
        HeartbeatResponse {
            error: code::NONE,
            message: None,
            member_id,
            member_epoch: m.epoch,
            heartbeat_interval_ms: config.heartbeat_interval_ms as i32,
            assignment,
        }
    }

    /// Fences members whose session lapsed or who did not revoke within
    /// their rebalance timeout. Returns how many went.
    pub fn tick(&mut self, now: u64, config: &ConsumerConfig) -> usize {
        let mut n = 0;
        for g in self.groups.values_mut() {
            let gone: Vec<String> = g
                .members
                .values()
                .filter(|m| {
                    m.last_heartbeat + config.session_timeout_ms <= now || m.revoke_deadline.is_some_and(|d| d <= now)
                })
                .map(|m| m.id.clone())
                .collect();
            for id in gone {
                g.members.remove(&id);
                g.target.remove(&id);
                g.epoch += 1;
                n += 1;
            }
        }
        n
    }

    /// Every group as a coordinator taking over would load it, by name.
    pub fn records(&self) -> Vec<GroupRecord> {
        self.groups.values().map(GroupRecord::of).collect()
    }

    /// What a heartbeat of `member` in `group` may change of the group's
    /// record: its epochs, its size and that member (a heartbeat moves no
    /// other member; a new target comes with a new epoch). Compared before
    /// and after, at the cost of one member.
    pub fn heartbeat_mark(&self, group: &str, member: &str) -> Option<HeartbeatMark> {
        let g = self.groups.get(group)?;
        Some(HeartbeatMark {
            epoch: g.epoch,
            assignment_epoch: g.assignment_epoch,
            members: g.members.len(),
            member: g.members.get(member).map(MemberRecord::of),
        })
    }

    /// Replaces the groups with a master's records (see [`GroupRecord::load`]).
    pub fn load_records(&mut self, records: Vec<GroupRecord>, now: u64) {
        self.groups = records.into_iter().map(|r| (r.name.clone(), r.load(now))).collect();
    }

    /// Every member's session (and revocation deadline) starts again at
    /// `now`: a coordinator taking over, which members could not reach.
    pub fn restart_sessions(&mut self, now: u64) {
        for m in self.groups.values_mut().flat_map(|g| g.members.values_mut()) {
            m.last_heartbeat = now;
            if m.revoke_deadline.is_some() {
                m.revoke_deadline = Some(now + m.rebalance_timeout_ms.max(1));
            }
        }
    }

    /// Empty groups with nothing committed (`has_offsets` says which have)
    /// are forgotten.
    pub fn forget_unused(&mut self, has_offsets: impl Fn(&str) -> bool) -> usize {
        let before = self.groups.len();
        self.groups.retain(|name, g| !g.members.is_empty() || has_offsets(name));
        before - self.groups.len()
    }

    /// Whether an OffsetCommit by (member, epoch) is accepted here: an
    /// error code, or None when `group` is not a consumer group.
    pub fn validate_commit(&self, group: &str, member_id: &str, epoch: i32) -> Option<i16> {
        let g = self.groups.get(group)?;
        if member_id.is_empty() && epoch < 0 {
            // An admin's or a standalone consumer's commit: only while empty.
            return Some(if g.members.is_empty() {
                code::NONE
            } else {
                code::UNKNOWN_MEMBER_ID
            });
        }
        Some(match g.members.get(member_id) {
            None => code::UNKNOWN_MEMBER_ID,
            // A static member that left is at epoch -2 (Kafka's record).
            Some(m) if m.left || m.epoch != epoch => err::STALE_MEMBER_EPOCH,
            Some(_) => code::NONE,
        })
    }
}

/// Moves member `id` towards its target (Kafka's CurrentAssignmentBuilder).
fn reconcile(g: &mut ConsumerGroup, id: &str, owned: Option<&[Tp]>, now: u64) {
    let target_epoch = g.assignment_epoch;
    let target: BTreeSet<Tp> = g.target.get(id).cloned().unwrap_or_default();
    // Partitions other members still hold (owned or being revoked).
    let others: BTreeSet<Tp> = g
        .members
        .values()
        .filter(|m| m.id != id)
        .flat_map(|m| m.assigned.iter().chain(m.revoking.iter()).cloned())
        .collect();
    let Some(m) = g.members.get_mut(id) else { return };
    if m.state == MemberState::UnrevokedPartitions {
        // Still revoking until a heartbeat shows none of them owned.
        let done = owned.is_some_and(|o| o.iter().all(|tp| !m.revoking.contains(tp)));
        if !done {
            return;
        }
        m.revoking.clear();
        m.revoke_deadline = None;
    }
    if m.epoch == target_epoch && m.state == MemberState::Stable {
        return;
    }
    let current = m.assigned.clone();
    let revoke: BTreeSet<Tp> = current.difference(&target).cloned().collect();
    if !revoke.is_empty() {
        m.assigned = current.intersection(&target).cloned().collect();
        m.revoking = revoke;
        m.state = MemberState::UnrevokedPartitions;
        m.revoke_deadline = Some(now + m.rebalance_timeout_ms.max(1));
        return;
    }
    let mut next = current.clone();
    let mut unreleased = false;
    for tp in target.difference(&current) {
        if others.contains(tp) {
            unreleased = true;
        } else {
            next.insert(tp.clone());
        }
    }
    m.previous_epoch = m.epoch;
    m.epoch = target_epoch;
    m.assigned = next;
    m.state = if unreleased {
        MemberState::UnreleasedPartitions
    } else {
        MemberState::Stable
    };
}

/// The target assignment for the group's members and subscribed topics.
fn assign(
    assignor: &str,
    g: &ConsumerGroup,
    previous: &BTreeMap<String, BTreeSet<Tp>>,
) -> BTreeMap<String, BTreeSet<Tp>> {
    let mut out: BTreeMap<String, BTreeSet<Tp>> = g.members.keys().map(|id| (id.clone(), BTreeSet::new())).collect();
    if g.members.is_empty() {
        return out;
    }
    if assignor == "range" {
        // Per topic: its subscribers sorted, contiguous ranges of partitions.
        for (topic, n) in &g.topics {
            let subs: Vec<&String> = g
                .members
                .values()
                .filter(|m| m.subscribed.contains(topic))
                .map(|m| &m.id)
                .collect();
            if subs.is_empty() {
                continue;
            }
            let (per, extra) = (*n as usize / subs.len(), *n as usize % subs.len());
            let mut p = 0u32;
            for (i, id) in subs.iter().enumerate() {
                let take = per + usize::from(i < extra);
                for _ in 0..take {
                    if let Some(set) = out.get_mut(*id) {
                        set.insert((topic.clone(), p));
                    }
                    p += 1;
                }
            }
        }
        return out;
    }
    // Uniform: balanced and sticky. Every partition of a subscribed topic
    // goes to a subscriber; previous owners keep theirs up to their share.
    let all: Vec<Tp> = g
        .topics
        .iter()
        .flat_map(|(t, n)| (0..*n).map(move |p| (t.clone(), p)))
        .collect();
    let eligible = |tp: &Tp| -> Vec<&String> {
        g.members
            .values()
            .filter(|m| m.subscribed.contains(&tp.0))
            .map(|m| &m.id)
            .collect()
    };
    // Each member's share: its eligible partitions spread over their subscribers.
    let mut share: BTreeMap<&String, f64> = BTreeMap::new();
    for tp in &all {
        let e = eligible(tp);
        for id in &e {
            *share.entry(*id).or_default() += 1.0 / e.len() as f64;
        }
    }
    let cap = |id: &String| share.get(id).map_or(0, |s| s.ceil() as usize);
    let mut unassigned = Vec::new();
    for tp in &all {
        let keeper = previous
            .iter()
            .find(|(id, set)| set.contains(tp) && g.members.get(*id).is_some_and(|m| m.subscribed.contains(&tp.0)))
            .map(|(id, _)| id.clone());
        match keeper {
            Some(id) if out.get(&id).is_some_and(|s| s.len() < cap(&id)) => {
                if let Some(s) = out.get_mut(&id) {
                    s.insert(tp.clone());
                }
            }
            _ => unassigned.push(tp.clone()),
        }
    }
    for tp in unassigned {
        let best = eligible(&tp)
            .into_iter()
            .min_by_key(|id| (out.get(*id).map_or(0, BTreeSet::len), (*id).clone()))
            .cloned();
        if let Some(id) = best {
            if let Some(s) = out.get_mut(&id) {
                s.insert(tp);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: ConsumerConfig = ConsumerConfig {
        session_timeout_ms: 45_000,
        heartbeat_interval_ms: 5_000,
        max_size: 100,
        max_subscribed_topics: 3,
    };

    fn topics(t: &str) -> Option<u32> {
        match t {
            "t" => Some(6),
            "u" => Some(2),
            _ => None,
        }
    }

    /// A heartbeat of group "g" (topics t: 6, u: 2).
    fn send(c: &mut ConsumerGroups, req: HeartbeatRequest, now: u64) -> HeartbeatResponse {
        c.heartbeat(
            HeartbeatRequest {
                group: "g".into(),
                ..req
            },
            now,
            &topics,
            &CFG,
            true,
        )
    }

    fn join_as(c: &mut ConsumerGroups, id: &str, subs: &[&str], instance: Option<&str>, now: u64) -> HeartbeatResponse {
        let req = HeartbeatRequest {
            member_id: id.into(),
            member_epoch: 0,
            instance_id: instance.map(String::from),
            rebalance_timeout_ms: 30_000,
            subscribed_topics: Some(subs.iter().map(|s| s.to_string()).collect()),
            owned: Some(Vec::new()),
            ..HeartbeatRequest::default()
        };
        send(c, req, now)
    }

    fn join(c: &mut ConsumerGroups, id: &str, subs: &[&str], now: u64) -> HeartbeatResponse {
        join_as(c, id, subs, None, now)
    }

    fn beat_as(
        c: &mut ConsumerGroups,
        id: &str,
        instance: Option<&str>,
        epoch: i32,
        owned: Option<Vec<Tp>>,
        now: u64,
    ) -> HeartbeatResponse {
        let req = HeartbeatRequest {
            member_id: id.into(),
            member_epoch: epoch,
            instance_id: instance.map(String::from),
            rebalance_timeout_ms: -1,
            owned,
            ..HeartbeatRequest::default()
        };
        send(c, req, now)
    }

    fn beat(c: &mut ConsumerGroups, id: &str, epoch: i32, owned: Option<Vec<Tp>>, now: u64) -> HeartbeatResponse {
        beat_as(c, id, None, epoch, owned, now)
    }

    fn owners(c: &ConsumerGroups) -> BTreeMap<Tp, Vec<String>> {
        let mut o: BTreeMap<Tp, Vec<String>> = BTreeMap::new();
        for m in c.groups["g"].members.values() {
            for tp in m.assigned.iter().chain(m.revoking.iter()) {
                o.entry(tp.clone()).or_default().push(m.id.clone());
            }
        }
        o
    }

    fn join_static(c: &mut ConsumerGroups, id: &str, instance: &str, now: u64) -> HeartbeatResponse {
        join_as(c, id, &["t"], Some(instance), now)
    }

    fn beat_static(c: &mut ConsumerGroups, id: &str, instance: &str, epoch: i32, now: u64) -> HeartbeatResponse {
        beat_as(c, id, Some(instance), epoch, None, now)
    }

    fn partitions(r: &HeartbeatResponse) -> Vec<Tp> {
        let mut v = r.assignment.clone().unwrap_or_default();
        v.sort();
        v
    }

    #[test]
    fn a_static_member_leaving_keeps_its_place_for_its_instance_id() {
        let mut c = ConsumerGroups::default();
        let a = join_static(&mut c, "a1", "inst-a", 0);
        let b = join(&mut c, "b", &["t"], 10);
        // Converge: a revokes three, b takes them.
        let keep = beat_static(&mut c, "a1", "inst-a", a.member_epoch, 20)
            .assignment
            .unwrap_or_default();
        let a2 = beat_as(&mut c, "a1", Some("inst-a"), a.member_epoch, Some(keep.clone()), 30);
        beat(&mut c, "b", b.member_epoch, Some(Vec::new()), 40);
        assert_eq!(c.groups["g"].state(), "Stable");
        let epoch = c.groups["g"].epoch;
        // a leaves as a static member: still in the group, nothing moves.
        let left = beat_static(&mut c, "a1", "inst-a", -2, 50);
        assert_eq!((left.error, left.member_epoch), (0, -2));
        assert_eq!(c.groups["g"].members.len(), 2);
        assert_eq!(
            c.groups["g"].state(),
            "Reconciling",
            "a static member away is not reconciled"
        );
        assert_eq!(c.groups["g"].epoch, epoch, "no rebalance for a static leave");
        // Its old id may not heartbeat on.
        assert_eq!(
            beat_static(&mut c, "a1", "inst-a", a2.member_epoch, 55).error,
            err::FENCED_MEMBER_EPOCH
        );
        // The same instance id with a new member id: the same partitions,
        // the same epochs.
        let a3 = join_static(&mut c, "a2", "inst-a", 60);
        assert_eq!(a3.error, 0, "{a3:?}");
        let mut keep_sorted = keep.clone();
        keep_sorted.sort();
        assert_eq!(partitions(&a3), keep_sorted);
        assert_eq!(a3.member_epoch, a2.member_epoch);
        assert_eq!(c.groups["g"].epoch, epoch);
        assert!(!c.groups["g"].members.contains_key("a1"));
        assert!(owners(&c).values().all(|o| o.len() == 1));
        // The member it replaced is fenced.
        assert_eq!(
            beat_static(&mut c, "a1", "inst-a", a2.member_epoch, 65).error,
            err::FENCED_INSTANCE_ID
        );
        // A second member with the instance id while a2 holds it: refused,
        // and a2 keeps everything.
        let dup = join_static(&mut c, "a3", "inst-a", 70);
        assert_eq!(dup.error, err::UNRELEASED_INSTANCE_ID);
        assert_eq!(c.groups["g"].members.len(), 2);
        let a4 = beat_static(&mut c, "a2", "inst-a", a3.member_epoch, 80);
        assert_eq!((a4.error, a4.member_epoch), (0, a3.member_epoch));
        assert_eq!(c.groups["g"].members["a2"].assigned.len(), 3);
    }

    #[test]
    fn a_static_leave_frees_what_it_was_revoking_and_its_own_id_may_come_back() {
        let mut c = ConsumerGroups::default();
        let a = join_static(&mut c, "a1", "inst-a", 0);
        assert_eq!(partitions(&a).len(), 6);
        let b = join(&mut c, "b", &["t"], 10);
        let mut keep = beat_static(&mut c, "a1", "inst-a", a.member_epoch, 20)
            .assignment
            .unwrap_or_default();
        keep.sort();
        assert_eq!(c.groups["g"].members["a1"].revoking.len(), 3, "a1 gives up three");
        // It leaves (static) before reporting the revocation: the three
        // are free at once, not after its session.
        beat_static(&mut c, "a1", "inst-a", -2, 30);
        assert!(c.groups["g"].members["a1"].revoking.is_empty());
        let b2 = beat(&mut c, "b", b.member_epoch, Some(Vec::new()), 40);
        assert_eq!(partitions(&b2).len(), 3, "{b2:?}");
        // The same process subscribes again under its own id: its three.
        let a2 = join_static(&mut c, "a1", "inst-a", 50);
        assert_eq!((a2.error, partitions(&a2)), (0, keep));
        assert!(!c.groups["g"].members["a1"].left);
        assert!(owners(&c).values().all(|o| o.len() == 1));
    }

    #[test]
    fn a_static_member_that_does_not_come_back_goes_at_its_session_timeout() {
        let mut c = ConsumerGroups::default();
        let a = join_static(&mut c, "a1", "inst-a", 0);
        assert_eq!(partitions(&a).len(), 6);
        beat_static(&mut c, "a1", "inst-a", -2, 1_000);
        assert_eq!(
            c.tick(1_000 + CFG.session_timeout_ms - 1, &CFG),
            0,
            "kept within its session"
        );
        assert_eq!(c.tick(1_000 + CFG.session_timeout_ms, &CFG), 1);
        assert!(c.groups["g"].members.is_empty());
        // A dynamic member leaving with -2 (no instance id) just leaves.
        let b = join(&mut c, "b", &["t"], 50_000);
        beat(&mut c, "b", -2, None, 50_010);
        assert!(c.groups["g"].members.is_empty(), "{b:?}");
    }

    #[test]
    fn members_converge_without_two_owners_of_a_partition() {
        let mut c = ConsumerGroups::default();
        let a = join(&mut c, "a", &["t"], 0);
        assert_eq!((a.error, a.member_epoch), (0, 1));
        assert_eq!(a.assignment.as_ref().map(Vec::len), Some(6), "alone: all six");
        // b joins: a must revoke three before b may have them.
        let b = join(&mut c, "b", &["t"], 10);
        assert_eq!(b.assignment, Some(Vec::new()), "nothing free yet");
        assert_eq!(c.groups["g"].members["b"].state, MemberState::UnreleasedPartitions);
        assert_eq!(b.member_epoch, 2);
        let a2 = beat(&mut c, "a", 1, None, 20);
        let keep = a2.assignment.unwrap_or_default();
        assert_eq!(keep.len(), 3, "a keeps three, revokes three");
        assert_eq!(a2.member_epoch, 1, "epoch held until revoked");
        assert!(owners(&c).values().all(|o| o.len() == 1));
        // b asks again: still unreleased.
        let b2 = beat(&mut c, b.member_id.as_str(), b.member_epoch, Some(Vec::new()), 30);
        assert!(b2.assignment.is_none() || b2.assignment == Some(Vec::new()));
        // a reports the revocation done; then b gets the three.
        let a3 = beat(&mut c, "a", 1, Some(keep.clone()), 40);
        assert_eq!(a3.member_epoch, 2);
        let b3 = beat(&mut c, "b", b.member_epoch, Some(Vec::new()), 50);
        let got = b3.assignment.unwrap_or_default();
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|tp| !keep.contains(tp)));
        assert_eq!(c.groups["g"].state(), "Stable");
        // A stale epoch is fenced.
        assert_eq!(beat(&mut c, "a", 1, None, 60).error, err::FENCED_MEMBER_EPOCH);
    }

    #[test]
    fn a_coordinator_taking_over_keeps_epochs_members_and_assignments() -> Result<(), String> {
        let mut c = ConsumerGroups::default();
        join(&mut c, "a", &["t"], 0);
        let b = join(&mut c, "b", &["t"], 10);
        // Mid-reconciliation: a still has three to revoke.
        let keep = beat(&mut c, "a", 1, None, 20).assignment.unwrap_or_default();
        assert_eq!(c.groups["g"].members["a"].revoking.len(), 3);
        let records = c.records();
        let wire = serde_json::to_vec(&records).map_err(|e| e.to_string())?;
        let got: Vec<GroupRecord> = serde_json::from_slice(&wire).map_err(|e| e.to_string())?;
        assert_eq!(got, records);
        let mut next = ConsumerGroups::default();
        let later = 1_000_000;
        next.load_records(got, later);
        assert_eq!(next.records(), records, "loaded as it was");
        assert_eq!(next.groups["g"].state(), "Reconciling");
        // Sessions, and a's time to revoke (its 30 s rebalance timeout), run
        // from the load.
        assert_eq!(next.tick(later + 29_999, &CFG), 0);
        // The members go on with their epochs: a finishes revoking, b gets
        // the three; nobody owns a partition twice; a stale epoch is fenced.
        assert_eq!(beat(&mut next, "a", 1, Some(keep.clone()), later + 10).member_epoch, 2);
        let b2 = beat(&mut next, "b", b.member_epoch, Some(Vec::new()), later + 20);
        assert_eq!((b2.error, b2.assignment.map(|a| a.len())), (0, Some(3)));
        assert!(owners(&next).values().all(|o| o.len() == 1));
        assert_eq!(next.groups["g"].state(), "Stable");
        assert_eq!(
            beat(&mut next, "a", 1, None, later + 30).error,
            err::FENCED_MEMBER_EPOCH
        );
        Ok(())
    }

    #[test]
    fn a_heartbeat_mark_moves_with_what_a_record_keeps() {
        let mut c = ConsumerGroups::default();
        assert!(c.heartbeat_mark("g", "a").is_none());
        join(&mut c, "a", &["t"], 0);
        let settled = c.heartbeat_mark("g", "a");
        let owned: Vec<Tp> = c.groups["g"].members["a"].assigned.iter().cloned().collect();
        beat(&mut c, "a", 1, Some(owned), 10);
        assert_eq!(
            c.heartbeat_mark("g", "a"),
            settled,
            "a plain heartbeat changes nothing kept"
        );
        join(&mut c, "b", &["t"], 20);
        assert_ne!(c.heartbeat_mark("g", "a"), settled, "a member joined");
    }

    struct Named;
    impl Topics for Named {
        fn partitions(&self, t: &str) -> Option<u32> {
            topics(t).or((t == "t2").then_some(1))
        }
        fn names(&self) -> Vec<String> {
            vec!["t".into(), "u".into(), "t2".into()]
        }
    }

    /// Topics whose names are counted when asked for, at a version.
    struct Versioned {
        asked: std::cell::Cell<u32>,
        version: std::cell::Cell<u64>,
        names: std::cell::RefCell<Vec<String>>,
    }
    impl Topics for Versioned {
        fn partitions(&self, t: &str) -> Option<u32> {
            self.names.borrow().iter().any(|n| n == t).then_some(1)
        }
        fn names(&self) -> Vec<String> {
            self.asked.set(self.asked.get() + 1);
            self.names.borrow().clone()
        }
        fn version(&self) -> u64 {
            self.version.get()
        }
    }

    #[test]
    fn regular_expressions_are_matched_again_only_when_the_topics_change() {
        let mut c = ConsumerGroups::default();
        let topics = Versioned {
            asked: std::cell::Cell::new(0),
            version: std::cell::Cell::new(1),
            names: std::cell::RefCell::new(vec!["t1".into(), "u".into()]),
        };
        let req = |member: &str, regex: Option<&str>, names: Option<Vec<String>>| HeartbeatRequest {
            group: "g".into(),
            member_id: member.into(),
            member_epoch: 0,
            rebalance_timeout_ms: 30_000,
            subscribed_regex: regex.map(String::from),
            subscribed_topics: names,
            owned: Some(Vec::new()),
            ..HeartbeatRequest::default()
        };
        c.heartbeat(req("a", Some("t.*"), None), 0, &topics, &CFG, true);
        assert_eq!(topics.asked.get(), 1, "the expression is matched when it comes");
        c.heartbeat(req("b", None, Some(vec!["u".into()])), 10, &topics, &CFG, true);
        assert_eq!(
            topics.asked.get(),
            1,
            "another member's heartbeat matches nothing again"
        );
        // A topic is made: the next heartbeat of anyone matches again.
        topics.names.borrow_mut().push("t2".into());
        topics.version.set(2);
        let mut again = req("b", None, None);
        again.member_epoch = c.groups["g"].members["b"].epoch;
        c.heartbeat(again, 20, &topics, &CFG, true);
        assert_eq!(topics.asked.get(), 2);
        let subscribed: Vec<&str> = c.groups["g"].members["a"]
            .subscribed
            .iter()
            .map(String::as_str)
            .collect();
        assert_eq!(subscribed, ["t1", "t2"]);
    }

    #[test]
    fn a_regular_expression_subscribes_to_the_topics_it_matches_whole() {
        let mut c = ConsumerGroups::default();
        let r = c.heartbeat(
            HeartbeatRequest {
                group: "g".into(),
                member_id: "a".into(),
                member_epoch: 0,
                rebalance_timeout_ms: 30_000,
                subscribed_regex: Some("t.*".into()),
                owned: Some(Vec::new()),
                ..HeartbeatRequest::default()
            },
            0,
            &Named,
            &CFG,
            true,
        );
        let mut got: Vec<String> = r.assignment.unwrap_or_default().into_iter().map(|(t, _)| t).collect();
        got.dedup();
        assert_eq!(got, vec!["t".to_string(), "t2".to_string()], "not u; t2 whole");
        let bad = c.heartbeat(
            HeartbeatRequest {
                group: "g".into(),
                member_id: "b".into(),
                member_epoch: 0,
                rebalance_timeout_ms: 30_000,
                subscribed_regex: Some("(".into()),
                owned: Some(Vec::new()),
                ..HeartbeatRequest::default()
            },
            0,
            &Named,
            &CFG,
            true,
        );
        assert_eq!(bad.error, err::INVALID_REGULAR_EXPRESSION);
        assert!(!c.groups["g"].members.contains_key("b"), "refused before joining");
        // A valid pattern too long to compile under the lock: refused too.
        let long = c.heartbeat(
            HeartbeatRequest {
                group: "g".into(),
                member_id: "b".into(),
                member_epoch: 0,
                rebalance_timeout_ms: 30_000,
                subscribed_regex: Some("t|".repeat(MAX_REGEX_BYTES / 2 + 1)),
                owned: Some(Vec::new()),
                ..HeartbeatRequest::default()
            },
            0,
            &Named,
            &CFG,
            true,
        );
        assert_eq!(long.error, err::INVALID_REGULAR_EXPRESSION);
        assert!(!c.groups["g"].members.contains_key("b"));
    }

    #[test]
    fn a_member_subscribes_to_a_bounded_number_of_names() {
        let mut c = ConsumerGroups::default();
        let r = join(&mut c, "a", &["t", "u", "v", "w"], 0);
        assert_eq!(r.error, err::INVALID_REQUEST);
        assert!(!c.groups.get("g").is_some_and(|g| g.members.contains_key("a")));
        assert_eq!(join(&mut c, "a", &["t", "u"], 0).error, 0);
    }

    #[test]
    fn a_silent_member_is_fenced_and_its_partitions_move() {
        let mut c = ConsumerGroups::default();
        join(&mut c, "a", &["t"], 0);
        let b = join(&mut c, "b", &["t"], 0);
        let a = beat(&mut c, "a", 1, None, 1);
        beat(&mut c, "a", a.member_epoch, a.assignment.clone(), 2);
        beat(&mut c, "b", b.member_epoch, Some(Vec::new()), 3);
        // b stops; a keeps heartbeating.
        let mut t = 3;
        while t < 50_000 {
            t += 5_000;
            let e = c.groups["g"].members["a"].epoch;
            let owned: Vec<Tp> = c.groups["g"].members["a"].assigned.iter().cloned().collect();
            let r = beat(&mut c, "a", e, Some(owned), t);
            assert_eq!(r.error, 0);
            c.tick(t, &CFG);
        }
        assert!(!c.groups["g"].members.contains_key("b"), "b fenced");
        let e = c.groups["g"].members["a"].epoch;
        let owned: Vec<Tp> = c.groups["g"].members["a"].assigned.iter().cloned().collect();
        let r = beat(&mut c, "a", e, Some(owned), t + 1);
        assert_eq!(c.groups["g"].members["a"].assigned.len(), 6, "{r:?}");
    }

    #[test]
    fn range_and_uniform_assign_every_partition_once() {
        let mut g = ConsumerGroup::default();
        for (id, subs) in [("m1", vec!["t", "u"]), ("m2", vec!["t"]), ("m3", vec!["t", "u"])] {
            g.members.insert(
                id.to_string(),
                Member {
                    id: id.to_string(),
                    instance_id: None,
                    rack_id: None,
                    client_id: String::new(),
                    client_host: String::new(),
                    epoch: 0,
                    previous_epoch: 0,
                    state: MemberState::Stable,
                    subscribed: subs.iter().map(|s| s.to_string()).collect(),
                    names: subs.into_iter().map(String::from).collect(),
                    regex: None,
                    assignor: None,
                    rebalance_timeout_ms: 0,
                    assigned: BTreeSet::new(),
                    revoking: BTreeSet::new(),
                    left: false,
                    last_heartbeat: 0,
                    revoke_deadline: None,
                    sent: None,
                    regex_matches: BTreeSet::new(),
                    regex_at: 0,
                },
            );
        }
        g.topics = [("t".to_string(), 6), ("u".to_string(), 2)].into_iter().collect();
        for a in ASSIGNORS {
            let out = assign(a, &g, &BTreeMap::new());
            let mut all: Vec<&Tp> = out.values().flatten().collect();
            all.sort();
            assert_eq!(all.len(), 8, "{a}: {out:?}");
            all.dedup();
            assert_eq!(all.len(), 8, "{a}: each once");
            assert!(out["m2"].iter().all(|(t, _)| t == "t"), "{a}: m2 only gets its topic");
            let sizes: Vec<usize> = out.values().map(BTreeSet::len).collect();
            assert!(
                sizes.iter().max().unwrap_or(&0) - sizes.iter().min().unwrap_or(&0) <= 1,
                "{a}: balanced {sizes:?}"
            );
        }
    }
}
