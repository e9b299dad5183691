//! The classic group coordinator. See the crate docs for the states; each
//! method below says which states accept its event and what it causes.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::types::*;

/// `[group]` configuration (documented in `config/rokka.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GroupConfig {
    /// Delay before the first rebalance of an empty group completes, so
    /// members starting together land in one generation
    /// (Kafka group.initial.rebalance.delay.ms).
    pub initial_rebalance_delay_ms: u64,
    /// Smallest session timeout a member may ask for.
    pub min_session_timeout_ms: u64,
    /// Largest session timeout a member may ask for.
    pub max_session_timeout_ms: u64,
    /// Offsets of a group that stayed empty this long are deleted
    /// (Kafka offsets.retention.minutes, in ms).
    pub offsets_retention_ms: u64,
    /// Most groups the coordinator holds (group names come from clients;
    /// 0 = no limit). A JoinGroup that would create one more is answered
    /// COORDINATOR_NOT_AVAILABLE, which clients retry; empty groups without
    /// committed offsets are forgotten within seconds, so room comes back.
    pub max_groups: u32,
    /// Most members (with member ids handed out and not yet used) in one
    /// group (Kafka group.max.size; 0 = no limit); a new member beyond it
    /// gets GROUP_MAX_SIZE_REACHED.
    pub max_group_size: u32,
    /// Most protocols (assignors) one JoinGroup may list (0 = no limit);
    /// more is INCONSISTENT_GROUP_PROTOCOL. Real clients list one to three;
    /// choosing the group's protocol compares every member's lists.
    pub max_member_protocols: u32,
    /// A KIP-848 consumer-group member that sends no heartbeat for this
    /// long is fenced (Kafka group.consumer.session.timeout.ms).
    pub consumer_session_timeout_ms: u64,
    /// How often KIP-848 members are told to heartbeat (Kafka
    /// group.consumer.heartbeat.interval.ms).
    pub consumer_heartbeat_interval_ms: u64,
    /// Most topic names one KIP-848 member may subscribe to (0 = no
    /// limit); more is INVALID_REQUEST.
    pub consumer_max_subscribed_topics: u32,
    /// Cluster mode: longest an OffsetCommit or a completing SyncGroup
    /// waits for the set's in-sync replicas to hold it before it is answered
    /// COORDINATOR_NOT_AVAILABLE (Kafka offsets.commit.timeout.ms). Under
    /// the 9 s a librdkafka member with the smallest session timeout (6 s)
    /// waits for its SyncGroup, so it gets an answer it can retry.
    pub commit_timeout_ms: u64,
    /// About the bytes every group's members may hold at once (0 = no
    /// limit): ids, protocol metadata, assignments, KIP-848 subscriptions.
    /// A JoinGroup, a new KIP-848 member or a leader's assignment that
    /// would go past it is answered COORDINATOR_NOT_AVAILABLE, which
    /// clients retry (`rokka_group_member_bytes`,
    /// `rokka_group_joins_refused_total{reason="max_member_bytes"}`).
    pub max_member_bytes: u64,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            initial_rebalance_delay_ms: 3_000,
            min_session_timeout_ms: 6_000,
            max_session_timeout_ms: 1_800_000,
            offsets_retention_ms: 7 * 24 * 3600 * 1000,
            max_groups: 100_000,
            max_group_size: 10_000,
            max_member_protocols: 64,
            consumer_session_timeout_ms: 45_000,
            consumer_heartbeat_interval_ms: 5_000,
            consumer_max_subscribed_topics: 10_000,
            commit_timeout_ms: 5_000,
            max_member_bytes: 512 << 20,
        }
    }
}

/// A JoinGroup answered at once with error `e`.
fn join_error(token: Token, e: i16, member_id: &str) -> Vec<Reply> {
    vec![Reply::Join(
        token,
        JoinResponse {
            error: e,
            generation: -1,
            member_id: member_id.to_string(),
            ..JoinResponse::default()
        },
    )]
}

/// How often the coordinator counts what members hold exactly.
const RECOUNT_MS: u64 = 1000;

/// About what a classic member holds: its ids, protocol names and metadata,
/// its assignment.
fn member_cost(rec: &MemberRecord) -> usize {
    128 + rec.id.len()
        + rec.instance_id.as_ref().map_or(0, String::len)
        + rec.client_id.len()
        + rec.client_host.len()
        + rec.protocols.iter().map(|(n, m)| 32 + n.len() + m.len()).sum::<usize>()
        + rec.assignment.len()
}

/// [`member_cost`] of the member a JoinGroup makes (its id still to come).
fn join_cost(req: &JoinRequest) -> usize {
    128 + req.member_id.len().max(64)
        + req.instance_id.as_ref().map_or(0, String::len)
        + req.client_id.len()
        + req.client_host.len()
        + req.protocols.iter().map(|(n, m)| 32 + n.len() + m.len()).sum::<usize>()
}

/// Bumped whenever a group's [`GroupRecord`] changes or a group goes:
/// what a master compares to know its replicas need the groups again.
static RECORD_CHANGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn records_changed() {
    RECORD_CHANGES.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
}

/// A classic group as it survives a coordinator move (Kafka's
/// GroupMetadataValue in `__consumer_offsets`): kept when a rebalance
/// completes or the group empties, loaded by the next coordinator as
/// Stable (or Empty) with every member's session starting then, so the
/// members keep their ids, generation and assignment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct GroupRecord {
    name: String,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    /// In join order.
    members: Vec<MemberRecord>,
}

/// What a member is beyond its live session: what a [`GroupRecord`] keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MemberRecord {
    id: String,
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout_ms: u64,
    rebalance_timeout_ms: u64,
    #[serde(with = "b64::pairs")]
    protocols: Vec<(String, Bytes)>,
    #[serde(with = "b64")]
    assignment: Bytes,
}

/// Members' metadata and assignments as base64 in the records' JSON (an
/// array of numbers is about three times the bytes).
mod b64 {
    use base64::Engine;
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer};

    const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

    pub fn serialize<S: Serializer>(b: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&B64.encode(b))
    }

    /// Base64, or the array of numbers an older master sent (a rolling
    /// upgrade).
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Either {
        Text(String),
        Numbers(Vec<u8>),
    }

    fn bytes<E: serde::de::Error>(e: Either) -> Result<Bytes, E> {
        match e {
            Either::Text(t) => B64.decode(t.as_bytes()).map(Bytes::from).map_err(E::custom),
            Either::Numbers(v) => Ok(Bytes::from(v)),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        bytes(Either::deserialize(d)?)
    }

    pub mod pairs {
        use super::*;
        use serde::ser::SerializeSeq;

        pub fn serialize<S: Serializer>(v: &[(String, Bytes)], s: S) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(Some(v.len()))?;
            for (n, b) in v {
                seq.serialize_element(&(n, B64.encode(b)))?;
            }
            seq.end()
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, Bytes)>, D::Error> {
            let v = <Vec<(String, Either)>>::deserialize(d)?;
            v.into_iter().map(|(n, e)| bytes(e).map(|b| (n, b))).collect()
        }
    }
}

/// Every group as a coordinator taking over would load it (see
/// [`GroupCoordinator::records`]): the classic groups and the KIP-848
/// consumer groups; cheap to take under the coordinator's lock, encoded and
/// decoded outside it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GroupRecords {
    classic: Vec<GroupRecord>,
    consumer: Vec<crate::consumer::GroupRecord>,
}

impl GroupRecords {
    /// The records as a replica receives them (JSON): the classic groups'
    /// array (as before consumer groups were replicated, so an older
    /// replica reads it), and the consumer groups' array apart (empty when
    /// there are none).
    pub fn encode(&self) -> (Vec<u8>, Vec<u8>) {
        let classic = serde_json::to_vec(&self.classic).unwrap_or_default();
        let consumer = match self.consumer.is_empty() {
            true => Vec::new(),
            false => serde_json::to_vec(&self.consumer).unwrap_or_default(),
        };
        (classic, consumer)
    }

    /// `consumer` None or empty: no consumer groups (a master older than
    /// them sends none).
    pub fn decode(classic: &[u8], consumer: Option<&[u8]>) -> Result<GroupRecords, String> {
        let classic = serde_json::from_slice(classic).map_err(|e| format!("group records: {e}"))?;
        let consumer = match consumer {
            Some(c) if !c.is_empty() => {
                serde_json::from_slice(c).map_err(|e| format!("consumer group records: {e}"))?
            }
            _ => Vec::new(),
        };
        Ok(GroupRecords { classic, consumer })
    }

    /// Groups of both kinds.
    pub fn len(&self) -> usize {
        self.classic.len() + self.consumer.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl GroupRecord {
    fn of(g: &Group) -> GroupRecord {
        GroupRecord {
            name: g.name.clone(),
            generation: g.generation,
            protocol_type: g.protocol_type.clone(),
            protocol: g.protocol.clone(),
            leader: g.leader.clone(),
            members: g.members_in_join_order().map(|m| m.rec.clone()).collect(),
        }
    }

    fn load(self, now: u64) -> Group {
        let mut g = Group::new(&self.name, now);
        g.generation = self.generation;
        g.protocol_type = self.protocol_type.clone();
        g.protocol = self.protocol.clone();
        g.leader = self.leader.clone();
        for m in &self.members {
            g.join_order.push(m.id.clone());
            g.members.insert(
                m.id.clone(),
                Member {
                    rec: m.clone(),
                    last_heartbeat: now,
                    awaiting_join: None,
                    awaiting_sync: None,
                },
            );
        }
        if !g.members.is_empty() {
            g.state = GroupState::Stable;
        }
        g.record = Some(self);
        g
    }
}

/// A member: what a record keeps of it, and its live session.
#[derive(Debug, Clone)]
struct Member {
    rec: MemberRecord,
    last_heartbeat: u64,
    awaiting_join: Option<Token>,
    awaiting_sync: Option<Token>,
}

impl std::ops::Deref for Member {
    type Target = MemberRecord;

    fn deref(&self) -> &MemberRecord {
        &self.rec
    }
}

impl std::ops::DerefMut for Member {
    fn deref_mut(&mut self) -> &mut MemberRecord {
        &mut self.rec
    }
}

impl Member {
    fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

#[derive(Debug)]
struct Group {
    name: String,
    state: GroupState,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    /// Insertion order matters for leader choice: keep a sequence number.
    members: BTreeMap<String, Member>,
    join_order: Vec<String>,
    /// Member ids handed out with MEMBER_ID_REQUIRED → deadline to rejoin.
    pending: HashMap<String, u64>,
    /// When the current PreparingRebalance must complete regardless, or
    /// (in CompletingRebalance) when members without a SyncGroup are
    /// dropped.
    rebalance_deadline: u64,
    /// Initial-delay state while it applies: (deadline, cap, whether a
    /// member joined since the deadline was set).
    initial_delay: Option<(u64, u64, bool)>,
    /// Since when the group has been Empty.
    empty_since: u64,
    /// The configured initial rebalance delay (for extensions).
    initial_delay_ms: u64,
    /// What a coordinator taking over loads: the group as of its last
    /// completed rebalance, or emptied (None: never either).
    record: Option<GroupRecord>,
}

impl Group {
    fn new(name: &str, now: u64) -> Group {
        Group {
            name: name.to_string(),
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            join_order: Vec::new(),
            pending: HashMap::new(),
            rebalance_deadline: 0,
            initial_delay: None,
            empty_since: now,
            initial_delay_ms: 0,
            record: None,
        }
    }

    fn members_in_join_order(&self) -> impl Iterator<Item = &Member> {
        self.join_order.iter().filter_map(|id| self.members.get(id))
    }

    fn supports(&self, req: &JoinRequest) -> bool {
        if self.members.is_empty() {
            return !req.protocol_type.is_empty() && !req.protocols.is_empty();
        }
        if self.protocol_type.as_deref() != Some(req.protocol_type.as_str()) {
            return false;
        }
        // Some protocol every member (and the joiner) supports.
        req.protocols.iter().any(|(p, _)| {
            self.members
                .values()
                .filter(|m| m.id != req.member_id)
                .all(|m| m.protocols.iter().any(|(q, _)| q == p))
        })
    }

    fn select_protocol(&self) -> Option<String> {
        let mut candidates: Vec<&String> = match self.members.values().next() {
            Some(m) => m.protocols.iter().map(|(p, _)| p).collect(),
            None => return None,
        };
        candidates.retain(|p| self.members.values().all(|m| m.protocols.iter().any(|(q, _)| q == *p)));
        // Each member votes for its first supported candidate.
        let mut votes: Vec<(&String, usize)> = candidates.iter().map(|c| (*c, 0)).collect();
        for m in self.members.values() {
            if let Some((p, _)) = m.protocols.iter().find(|(p, _)| candidates.contains(&p)) {
                if let Some(v) = votes.iter_mut().find(|(c, _)| *c == p) {
                    v.1 += 1;
                }
            }
        }
        let best = votes.iter().map(|(_, n)| *n).max()?;
        votes.iter().find(|(_, n)| *n == best).map(|(c, _)| (*c).clone())
    }

    fn join_response(&self, member_id: &str) -> JoinResponse {
        let leader = self.leader.clone().unwrap_or_default();
        let protocol = self.protocol.clone().unwrap_or_default();
        let members = if member_id == leader {
            self.members_in_join_order()
                .map(|m| (m.id.clone(), m.instance_id.clone(), m.metadata(&protocol)))
                .collect()
        } else {
            Vec::new()
        };
        JoinResponse {
            error: code::NONE,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader,
            member_id: member_id.to_string(),
            members,
            skip_assignment: false,
            durable: false,
        }
    }

    fn remove_member(&mut self, id: &str) -> Option<Member> {
        let m = self.members.remove(id)?;
        self.join_order.retain(|x| x != id);
        if self.leader.as_deref() == Some(id) {
            // Promote a member that already rejoined, else any.
            self.leader = self
                .join_order
                .iter()
                .find(|x| self.members.get(*x).is_some_and(|m| m.awaiting_join.is_some()))
                .or_else(|| self.join_order.first())
                .cloned();
        }
        Some(m)
    }

    fn max_rebalance_timeout(&self) -> u64 {
        self.members.values().map(|m| m.rebalance_timeout_ms).max().unwrap_or(0)
    }
}

/// The coordinator of every group. Not thread-safe by itself: the frontend
/// holds it behind one mutex and routes the returned replies.
#[derive(Debug)]
pub struct GroupCoordinator {
    config: GroupConfig,
    groups: HashMap<String, Group>,
    id_salt: u64,
    id_seq: u64,
    /// Parked JoinGroups answered because their member sent another.
    superseded_joins: u64,
    /// Parked SyncGroups answered because their member sent another.
    superseded_syncs: u64,
    /// JoinGroups refused by `max_groups` / `max_group_size`.
    refused_groups: u64,
    refused_members: u64,
    refused_protocols: u64,
    /// Classic members dropped at a tick: session ran out / no SyncGroup
    /// within the rebalance timeout.
    expired_sessions: u64,
    expired_syncs: u64,
    /// About what members hold (see [`GroupConfig::max_member_bytes`]):
    /// counted exactly every [`RECOUNT_MS`], and between counts raised by
    /// what each accepted join or assignment brings (never lowered, so it
    /// errs on the safe side until the next count).
    member_bytes: usize,
    counted_at: u64,
    refused_bytes: u64,
    /// KIP-848 consumer groups (names exclusive with `groups`).
    pub consumer: crate::consumer::ConsumerGroups,
}

impl GroupCoordinator {
    pub fn new(config: GroupConfig) -> GroupCoordinator {
        GroupCoordinator {
            config,
            groups: HashMap::new(),
            id_salt: rand::random(),
            id_seq: 0,
            superseded_joins: 0,
            superseded_syncs: 0,
            refused_groups: 0,
            refused_members: 0,
            refused_protocols: 0,
            expired_sessions: 0,
            expired_syncs: 0,
            member_bytes: 0,
            counted_at: 0,
            refused_bytes: 0,
            consumer: crate::consumer::ConsumerGroups::default(),
        }
    }

    /// What members hold now, about (see [`GroupConfig::max_member_bytes`]).
    pub fn member_bytes(&self) -> usize {
        self.member_bytes
    }

    /// Joins, new KIP-848 members and assignments refused by `max_member_bytes`.
    pub fn refused_for_bytes(&self) -> u64 {
        self.refused_bytes
    }

    fn recount(&mut self, now: u64) {
        let classic: usize = self
            .groups
            .values()
            .flat_map(|g| g.members.values())
            .map(|m| member_cost(&m.rec))
            .sum();
        self.member_bytes = classic + self.consumer.member_bytes();
        self.counted_at = now;
    }

    /// Takes `more` bytes into the count if they fit the budget.
    fn admit_bytes(&mut self, more: usize) -> bool {
        let max = self.config.max_member_bytes;
        if max > 0 && self.member_bytes.saturating_add(more) as u64 > max {
            self.refused_bytes += 1;
            return false;
        }
        self.member_bytes = self.member_bytes.saturating_add(more);
        true
    }

    fn consumer_config(&self) -> crate::consumer::ConsumerConfig {
        crate::consumer::ConsumerConfig {
            session_timeout_ms: self.config.consumer_session_timeout_ms,
            heartbeat_interval_ms: self.config.consumer_heartbeat_interval_ms,
            max_size: self.config.max_group_size as usize,
            max_subscribed_topics: self.config.consumer_max_subscribed_topics as usize,
        }
    }

    /// ConsumerGroupHeartbeat (KIP-848). An empty classic group of the same
    /// name becomes a consumer group; one with members is not one
    /// (GROUP_ID_NOT_FOUND, as Kafka without online migration).
    pub fn consumer_heartbeat(
        &mut self,
        req: crate::consumer::HeartbeatRequest,
        now: u64,
        topics: &dyn crate::consumer::Topics,
    ) -> crate::consumer::HeartbeatResponse {
        if let Some(g) = self.groups.get(&req.group) {
            // Only a member joining (epoch 0) converts it, as Kafka's
            // getOrMaybeCreateConsumerGroup with createIfNotExists: a
            // leave or a stale heartbeat naming an empty classic group
            // took the group away and left its offsets untracked.
            if g.members.is_empty() && g.pending.is_empty() && req.member_epoch == 0 {
                self.groups.remove(&req.group);
                records_changed();
            } else {
                return crate::consumer::HeartbeatResponse {
                    error: code::GROUP_ID_NOT_FOUND,
                    message: Some(format!("Group {} is not a consumer group.", req.group)),
                    member_id: req.member_id,
                    member_epoch: req.member_epoch,
                    ..Default::default()
                };
            }
        }
        if req.member_epoch == 0 {
            // A member joining (or rejoining) brings its subscription.
            let more = 256
                + req.member_id.len()
                + req.client_id.len()
                + req.client_host.len()
                + req
                    .subscribed_topics
                    .iter()
                    .flatten()
                    .map(|t| 32 + t.len())
                    .sum::<usize>()
                + req.subscribed_regex.as_ref().map_or(0, |r| 64 + 4 * r.len());
            if !self.admit_bytes(more) {
                return crate::consumer::HeartbeatResponse {
                    error: code::COORDINATOR_NOT_AVAILABLE,
                    member_id: req.member_id,
                    member_epoch: req.member_epoch,
                    ..Default::default()
                };
            }
        }
        let max = self.config.max_groups as usize;
        let may_create = max == 0 || self.group_count() < max;
        let cfg = self.consumer_config();
        // What a coordinator taking over would load changes with the
        // group's epochs, members and assignments.
        let (group, member) = (req.group.clone(), req.member_id.clone());
        let before = self.consumer.heartbeat_mark(&group, &member);
        let r = self.consumer.heartbeat(req, now, topics, &cfg, may_create);
        // (A joining member's id is the one the response gives it; its
        // joining changes the group's size anyway.)
        if self.consumer.heartbeat_mark(&group, &r.member_id) != before {
            records_changed();
        }
        if r.error == code::COORDINATOR_NOT_AVAILABLE {
            self.refused_groups += 1;
        } else if r.error == code::GROUP_MAX_SIZE_REACHED {
            self.refused_members += 1;
        }
        r
    }

    /// JoinGroups refused so far by (`max_groups`, `max_group_size`,
    /// `max_member_protocols`).
    pub fn refused(&self) -> (u64, u64, u64) {
        (self.refused_groups, self.refused_members, self.refused_protocols)
    }

    /// Groups held now (classic and consumer).
    pub fn group_count(&self) -> usize {
        self.groups.len() + self.consumer.groups.len()
    }

    /// (JoinGroups, SyncGroups) answered so far because the same member
    /// sent another while they were parked.
    pub fn superseded(&self) -> (u64, u64) {
        (self.superseded_joins, self.superseded_syncs)
    }

    /// (members whose session ran out, members dropped for not syncing
    /// within the rebalance timeout) so far.
    pub fn expired(&self) -> (u64, u64) {
        (self.expired_sessions, self.expired_syncs)
    }

    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    fn new_member_id(&mut self, client_id: &str) -> String {
        self.id_seq += 1;
        let x = self.id_salt ^ self.id_seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // The client id prefixes it as Kafka's does, cut to 255 bytes: the
        // member sends the id back on every request, and ids longer than
        // `kafka.max_id_bytes` are refused.
        let mut end = client_id.len().min(255);
        while !client_id.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}-{:016x}-{:016x}", &client_id[..end], x, self.id_seq)
    }

    /// JoinGroup. Accepted in every state but Dead; parks the request (its
    /// reply comes from this or a later event) unless answered at once.
    pub fn join(&mut self, mut req: JoinRequest, token: Token, now: u64) -> Vec<Reply> {
        let error = |e: i16, member_id: &str| join_error(token, e, member_id);
        if req.group.is_empty() {
            return error(code::INVALID_GROUP_ID, &req.member_id);
        }
        let max_protocols = self.config.max_member_protocols as usize;
        if max_protocols > 0 && req.protocols.len() > max_protocols {
            self.refused_protocols += 1;
            return error(code::INCONSISTENT_GROUP_PROTOCOL, &req.member_id);
        }
        // A protocol listed twice counts once (its first metadata).
        let mut seen = std::collections::HashSet::with_capacity(req.protocols.len());
        req.protocols.retain(|(name, _)| seen.insert(name.clone()));
        if req.session_timeout_ms < self.config.min_session_timeout_ms
            || req.session_timeout_ms > self.config.max_session_timeout_ms
        {
            return error(code::INVALID_SESSION_TIMEOUT, &req.member_id);
        }
        // What the member will hold beyond what it held (a rejoin keeps its
        // ids and usually its metadata). A first join that will be told
        // MEMBER_ID_REQUIRED keeps nothing but a pending id; a join answered
        // with an error gives its bytes back.
        let held = self
            .groups
            .get(&req.group)
            .and_then(|g| g.members.get(&req.member_id))
            .map_or(0, |m| member_cost(&m.rec));
        let first_of_two = req.member_id.is_empty() && req.require_known_member_id && req.instance_id.is_none();
        let charge = if first_of_two {
            0
        } else {
            join_cost(&req).saturating_sub(held)
        };
        if !self.admit_bytes(charge) {
            return error(code::COORDINATOR_NOT_AVAILABLE, &req.member_id);
        }
        let out = self.join_admitted(req, token, now);
        let refused = out
            .iter()
            .any(|r| matches!(r, Reply::Join(t, j) if *t == token && j.error != code::NONE));
        if refused {
            self.member_bytes = self.member_bytes.saturating_sub(charge);
        }
        out
    }

    /// [`GroupCoordinator::join`] once its bytes are admitted.
    fn join_admitted(&mut self, req: JoinRequest, token: Token, now: u64) -> Vec<Reply> {
        let error = |e: i16, member_id: &str| join_error(token, e, member_id);
        if let Some(cg) = self.consumer.groups.get(&req.group) {
            // A consumer group: a classic member may only take it over empty.
            if !cg.members.is_empty() {
                return error(code::INCONSISTENT_GROUP_PROTOCOL, &req.member_id);
            }
            self.consumer.groups.remove(&req.group);
            records_changed();
        }
        if !self.groups.contains_key(&req.group) {
            if !req.member_id.is_empty() {
                return error(code::UNKNOWN_MEMBER_ID, &req.member_id);
            }
            let max = self.config.max_groups as usize;
            if max > 0 && self.group_count() >= max {
                self.refused_groups += 1;
                return error(code::COORDINATOR_NOT_AVAILABLE, &req.member_id);
            }
            self.groups.insert(req.group.clone(), Group::new(&req.group, now));
        }
        let new_id = if req.member_id.is_empty() {
            Some(self.new_member_id(&req.client_id))
        } else {
            None
        };
        let Some(g) = self.groups.get_mut(&req.group) else {
            return error(code::COORDINATOR_NOT_AVAILABLE, &req.member_id);
        };
        if g.state == GroupState::Dead {
            return error(code::COORDINATOR_NOT_AVAILABLE, &req.member_id);
        }
        if !g.supports(&req) {
            return error(code::INCONSISTENT_GROUP_PROTOCOL, &req.member_id);
        }
        let mut out = Vec::new();
        let max_size = self.config.max_group_size as usize;
        let is_static_return = req
            .instance_id
            .as_ref()
            .is_some_and(|inst| g.members.values().any(|m| m.instance_id.as_ref() == Some(inst)));
        let is_new =
            (new_id.is_some() && !is_static_return) || (new_id.is_none() && !g.members.contains_key(&req.member_id));
        if is_new
            && max_size > 0
            && g.members.len() + g.pending.len() >= max_size
            && !g.pending.contains_key(&req.member_id)
        {
            self.refused_members += 1;
            return error(code::GROUP_MAX_SIZE_REACHED, &req.member_id);
        }
        if let Some(new_id) = new_id {
            // A static member rejoining replaces its old member id.
            if let Some(inst) = &req.instance_id {
                let old = g
                    .members
                    .values()
                    .find(|m| m.instance_id.as_ref() == Some(inst))
                    .map(|m| m.id.clone());
                if let Some(old_id) = old {
                    return Self::replace_static(g, &old_id, new_id, req, token, now, &self.config);
                }
            } else if req.require_known_member_id {
                g.pending.insert(new_id.clone(), now + req.session_timeout_ms);
                return error(code::MEMBER_ID_REQUIRED, &new_id);
            }
            Self::add_member(g, new_id, &req, token, now);
            Self::prepare_rebalance(g, now, &self.config, &mut out);
            Self::try_complete_join(g, now, &mut out);
            return out;
        }
        // A known (or pending) member id.
        if !g.members.contains_key(&req.member_id) {
            if g.pending.remove(&req.member_id).is_some() {
                let id = req.member_id.clone();
                Self::add_member(g, id, &req, token, now);
                Self::prepare_rebalance(g, now, &self.config, &mut out);
                Self::try_complete_join(g, now, &mut out);
                return out;
            }
            // A replaced static member's old id: fenced (Kafka's validateMember).
            return error(unknown_or_fenced(g, req.instance_id.as_deref()), &req.member_id);
        }
        if let (Some(inst), Some(m)) = (&req.instance_id, g.members.get(&req.member_id)) {
            if m.instance_id.as_ref() != Some(inst) {
                return error(code::FENCED_INSTANCE_ID, &req.member_id);
            }
        }
        let same_metadata = g
            .members
            .get(&req.member_id)
            .is_some_and(|m| m.protocols == req.protocols);
        let is_leader = g.leader.as_deref() == Some(req.member_id.as_str());
        match g.state {
            GroupState::PreparingRebalance => {
                self.superseded_joins += Self::update_member(g, &req, token, now, &mut out);
                Self::try_complete_join(g, now, &mut out);
            }
            GroupState::CompletingRebalance if same_metadata => {
                out.push(Reply::Join(token, g.join_response(&req.member_id)));
            }
            GroupState::Stable if same_metadata && !is_leader => {
                out.push(Reply::Join(token, g.join_response(&req.member_id)));
            }
            GroupState::CompletingRebalance | GroupState::Stable | GroupState::Empty => {
                self.superseded_joins += Self::update_member(g, &req, token, now, &mut out);
                Self::prepare_rebalance(g, now, &self.config, &mut out);
                Self::try_complete_join(g, now, &mut out);
            }
            GroupState::Dead => return error(code::COORDINATOR_NOT_AVAILABLE, &req.member_id),
        }
        out
    }

    fn replace_static(
        g: &mut Group,
        old_id: &str,
        new_id: String,
        req: JoinRequest,
        token: Token,
        now: u64,
        config: &GroupConfig,
    ) -> Vec<Reply> {
        let mut out = Vec::new();
        let leader_before = g.leader.clone();
        let Some(mut m) = g.members.remove(old_id) else {
            return out;
        };
        // Requests still parked under the old id are fenced.
        if let Some(t) = m.awaiting_join.take() {
            out.push(Reply::Join(
                t,
                JoinResponse {
                    error: code::FENCED_INSTANCE_ID,
                    generation: -1,
                    member_id: old_id.to_string(),
                    ..JoinResponse::default()
                },
            ));
        }
        if let Some(t) = m.awaiting_sync.take() {
            out.push(Reply::Sync(
                t,
                SyncResponse {
                    error: code::FENCED_INSTANCE_ID,
                    ..SyncResponse::default()
                },
            ));
        }
        // Kafka's replaceStaticMember then updateMember: the new id with the
        // join's protocols and timeouts, the assignment kept.
        m.id = new_id.clone();
        m.last_heartbeat = now;
        m.protocols = req.protocols.clone();
        m.session_timeout_ms = req.session_timeout_ms;
        m.rebalance_timeout_ms = req.rebalance_timeout_ms;
        m.client_id = req.client_id.clone();
        m.client_host = req.client_host.clone();
        for id in g.join_order.iter_mut() {
            if id == old_id {
                *id = new_id.clone();
            }
        }
        if g.leader.as_deref() == Some(old_id) {
            g.leader = Some(new_id.clone());
        }
        g.members.insert(new_id.clone(), m);
        if g.state == GroupState::Stable && g.select_protocol() == g.protocol {
            // KIP-345: no rebalance while the group's selected protocol
            // stays (a restarted member's metadata — owned partitions, user
            // data — may differ); the new id gets the current generation
            // and its assignment at SyncGroup. The record names the new id,
            // so a coordinator taking over does not fence it.
            g.record = Some(GroupRecord::of(g));
            records_changed();
            let mut resp = g.join_response(&new_id);
            if req.skip_assignment_supported {
                // v9+: the leader is told the group keeps its assignment.
                resp.skip_assignment = resp.leader == new_id;
            } else {
                // Before v9 the returning leader is answered as a follower
                // (the leader as it was), so it does not assign.
                resp.members.clear();
                resp.leader = leader_before.unwrap_or_default();
            }
            resp.durable = true;
            out.push(Reply::Join(token, resp));
            return out;
        }
        // The old id's parked requests were fenced above: nothing to supersede.
        Self::update_member(
            g,
            &JoinRequest {
                member_id: new_id,
                ..req
            },
            token,
            now,
            &mut out,
        );
        Self::prepare_rebalance(g, now, config, &mut out);
        Self::try_complete_join(g, now, &mut out);
        out
    }

    fn add_member(g: &mut Group, id: String, req: &JoinRequest, token: Token, now: u64) {
        if g.members.is_empty() {
            g.protocol_type = Some(req.protocol_type.clone());
        }
        if g.leader.is_none() {
            g.leader = Some(id.clone());
        }
        g.join_order.push(id.clone());
        g.members.insert(
            id.clone(),
            Member {
                rec: MemberRecord {
                    id,
                    instance_id: req.instance_id.clone(),
                    client_id: req.client_id.clone(),
                    client_host: req.client_host.clone(),
                    session_timeout_ms: req.session_timeout_ms,
                    rebalance_timeout_ms: req.rebalance_timeout_ms,
                    protocols: req.protocols.clone(),
                    assignment: Bytes::new(),
                },
                last_heartbeat: now,
                awaiting_join: Some(token),
                awaiting_sync: None,
            },
        );
        // Noted so the initial delay is extended once more (Kafka's
        // DelayedInitialJoin).
        if let Some((deadline, cap, _)) = g.initial_delay {
            g.initial_delay = Some((deadline, cap, true));
        }
    }

    /// Takes a known member's (re)join: its new metadata, and `token` parked
    /// as its join. A join it still had parked is superseded — answered now
    /// (see [`superseded_join`]) rather than dropped unanswered. Returns how
    /// many were (0 or 1).
    fn update_member(g: &mut Group, req: &JoinRequest, token: Token, now: u64, out: &mut Vec<Reply>) -> u64 {
        let Some(m) = g.members.get_mut(&req.member_id) else {
            return 0;
        };
        m.protocols = req.protocols.clone();
        m.session_timeout_ms = req.session_timeout_ms;
        m.rebalance_timeout_ms = req.rebalance_timeout_ms;
        m.client_id = req.client_id.clone();
        m.client_host = req.client_host.clone();
        m.last_heartbeat = now;
        match m.awaiting_join.replace(token) {
            Some(old) if old != token => {
                out.push(superseded_join(old, &m.id));
                1
            }
            _ => 0,
        }
    }

    /// Enters PreparingRebalance (from Empty, Stable or CompletingRebalance).
    fn prepare_rebalance(g: &mut Group, now: u64, config: &GroupConfig, out: &mut Vec<Reply>) {
        match g.state {
            GroupState::PreparingRebalance | GroupState::Dead => return,
            GroupState::CompletingRebalance => {
                // Followers waiting for the leader's assignment must rejoin.
                for m in g.members.values_mut() {
                    if let Some(t) = m.awaiting_sync.take() {
                        out.push(Reply::Sync(
                            t,
                            SyncResponse {
                                error: code::REBALANCE_IN_PROGRESS,
                                ..SyncResponse::default()
                            },
                        ));
                    }
                }
            }
            GroupState::Empty => {
                let delay = config.initial_rebalance_delay_ms;
                g.initial_delay_ms = delay;
                if delay > 0 {
                    let cap = now + g.max_rebalance_timeout().max(delay);
                    g.initial_delay = Some((now + delay, cap, false));
                }
            }
            GroupState::Stable => {}
        }
        g.state = GroupState::PreparingRebalance;
        g.rebalance_deadline = now + g.max_rebalance_timeout();
    }

    /// Completes the join phase when every member has rejoined (and the
    /// initial delay, if any, is over) or the rebalance timeout passed.
    fn try_complete_join(g: &mut Group, now: u64, out: &mut Vec<Reply>) {
        if g.state != GroupState::PreparingRebalance {
            return;
        }
        if let Some((deadline, cap, joined)) = g.initial_delay {
            if now < deadline {
                return;
            }
            // Members kept arriving during the delay: wait one more delay,
            // within the rebalance timeout.
            if joined && now < cap {
                let next = (now + g.initial_delay_ms).min(cap);
                g.initial_delay = Some((next, cap, false));
                return;
            }
        }
        // The initial delay over (and not extended): the join completes
        // with whoever joined, as Kafka's tryCompleteInitialRebalance —
        // a member id handed out to a client that never came back with it
        // does not hold the group's first generation.
        let initial_over = g.initial_delay.is_some();
        let all_joined = g.members.values().all(|m| m.awaiting_join.is_some());
        let ready = initial_over || (all_joined && g.pending.is_empty());
        if !ready && now < g.rebalance_deadline {
            return;
        }
        g.initial_delay = None;
        // Dynamic members that did not rejoin in time are dropped; static
        // members stay (their session expires them), assigned by the
        // leader like the others (Kafka's completeClassicGroupJoin).
        let missing: Vec<String> = g
            .members
            .values()
            .filter(|m| m.awaiting_join.is_none() && m.instance_id.is_none())
            .map(|m| m.id.clone())
            .collect();
        for id in missing {
            g.remove_member(&id);
        }
        if !g.members.is_empty() && g.members.values().all(|m| m.awaiting_join.is_none()) {
            // Only static members that have not rejoined: no leader to
            // assign; wait another rebalance timeout (or their sessions).
            g.rebalance_deadline = now + g.max_rebalance_timeout().max(1);
            return;
        }
        g.pending.clear();
        g.generation += 1;
        if g.members.is_empty() {
            g.state = GroupState::Empty;
            g.protocol = None;
            // The protocol type stays (Kafka keeps it: ListGroups and
            // DescribeGroups still say "consumer" for an emptied group).
            g.leader = None;
            g.empty_since = now;
            g.record = Some(GroupRecord::of(g));
            records_changed();
            return;
        }
        g.protocol = g.select_protocol();
        // The leader is a member that rejoined (it must assign).
        let rejoined = |g: &Group, id: &String| g.members.get(id).is_some_and(|m| m.awaiting_join.is_some());
        if g.leader.as_ref().is_none_or(|l| !rejoined(g, l)) {
            g.leader = g.join_order.iter().find(|id| rejoined(g, id)).cloned();
        }
        g.state = GroupState::CompletingRebalance;
        // Members that do not send their SyncGroup within the rebalance
        // timeout are dropped (Kafka's pending-sync expiry): a leader that
        // keeps heartbeating but never assigns would hold the group, and
        // its followers' parked syncs, for good.
        g.rebalance_deadline = now + g.max_rebalance_timeout();
        let ids: Vec<String> = g.join_order.clone();
        for id in ids {
            let resp = g.join_response(&id);
            if let Some(m) = g.members.get_mut(&id) {
                m.assignment = Bytes::new();
                // Sessions start again for the members answered; a static
                // member that has not rejoined keeps its own clock.
                if let Some(t) = m.awaiting_join.take() {
                    m.last_heartbeat = now;
                    out.push(Reply::Join(t, resp));
                }
            }
        }
    }

    /// SyncGroup. Parked in CompletingRebalance until the leader's arrives;
    /// answered at once in Stable; REBALANCE_IN_PROGRESS while preparing.
    pub fn sync(&mut self, req: SyncRequest, token: Token, now: u64) -> Vec<Reply> {
        let error = |e: i16| {
            vec![Reply::Sync(
                token,
                SyncResponse {
                    error: e,
                    ..SyncResponse::default()
                },
            )]
        };
        let Some(g) = self.groups.get_mut(&req.group) else {
            return error(code::UNKNOWN_MEMBER_ID);
        };
        if g.state == GroupState::Dead {
            return error(code::COORDINATOR_NOT_AVAILABLE);
        }
        let Some(m) = g.members.get(&req.member_id) else {
            return error(unknown_or_fenced(g, req.instance_id.as_deref()));
        };
        if req.instance_id.is_some() && m.instance_id != req.instance_id {
            return error(code::FENCED_INSTANCE_ID);
        }
        if req.generation != g.generation {
            return error(code::ILLEGAL_GENERATION);
        }
        if req
            .protocol_type
            .as_ref()
            .is_some_and(|p| g.protocol_type.as_ref() != Some(p))
            || req
                .protocol_name
                .as_ref()
                .is_some_and(|p| g.protocol.as_ref() != Some(p))
        {
            return error(code::INCONSISTENT_GROUP_PROTOCOL);
        }
        let ok = |g: &Group, assignment: Bytes| SyncResponse {
            error: code::NONE,
            protocol_type: g.protocol_type.clone(),
            protocol_name: g.protocol.clone(),
            assignment,
        };
        match g.state {
            GroupState::PreparingRebalance => error(code::REBALANCE_IN_PROGRESS),
            GroupState::Stable => {
                let a = m.assignment.clone();
                if let Some(m) = g.members.get_mut(&req.member_id) {
                    m.last_heartbeat = now;
                }
                vec![Reply::Sync(token, ok(g, a))]
            }
            GroupState::CompletingRebalance => {
                let mut out = Vec::new();
                if let Some(m) = g.members.get_mut(&req.member_id) {
                    // A sync it still had parked is superseded: answered now.
                    if let Some(old) = m.awaiting_sync.replace(token).filter(|old| *old != token) {
                        out.push(superseded_sync(old));
                        self.superseded_syncs += 1;
                    }
                    m.last_heartbeat = now;
                }
                if g.leader.as_deref() != Some(req.member_id.as_str()) {
                    return out;
                }
                // What the new assignments add over those they replace (of
                // members in the group: others are not kept).
                let new: usize = req
                    .assignments
                    .iter()
                    .filter(|(id, _)| g.members.contains_key(id))
                    .map(|(_, a)| a.len())
                    .sum();
                let old: usize = g.members.values().map(|m| m.assignment.len()).sum();
                let more = new.saturating_sub(old);
                let max = self.config.max_member_bytes;
                if max > 0 && self.member_bytes.saturating_add(more) as u64 > max {
                    // The leader is answered (it rejoins and syncs again);
                    // the others stay parked until it does, or until the
                    // rebalance timeout drops whoever has not synced.
                    self.refused_bytes += 1;
                    out.extend(error(code::COORDINATOR_NOT_AVAILABLE));
                    if let Some(m) = g.members.get_mut(&req.member_id) {
                        m.awaiting_sync = None;
                    }
                    return out;
                }
                self.member_bytes = self.member_bytes.saturating_add(more);
                let assignments: HashMap<String, Bytes> = req.assignments.into_iter().collect();
                for m in g.members.values_mut() {
                    m.assignment = assignments.get(&m.id).cloned().unwrap_or_default();
                }
                g.state = GroupState::Stable;
                g.record = Some(GroupRecord::of(g));
                records_changed();
                let ids: Vec<String> = g.members.keys().cloned().collect();
                for id in ids {
                    let resp = g.members.get(&id).map(|m| ok(g, m.assignment.clone()));
                    if let (Some(m), Some(resp)) = (g.members.get_mut(&id), resp) {
                        if let Some(t) = m.awaiting_sync.take() {
                            out.push(Reply::Sync(t, resp));
                        }
                    }
                }
                out
            }
            GroupState::Empty | GroupState::Dead => error(code::UNKNOWN_MEMBER_ID),
        }
    }

    /// Starts a rebalance of a Stable or CompletingRebalance group: its
    /// members learn it at their next heartbeat and rejoin. For membership
    /// the coordinator does not see (RocketMQ clients of a mixed group).
    pub fn force_rebalance(&mut self, group: &str, now: u64) -> Vec<Reply> {
        let mut out = Vec::new();
        if let Some(g) = self.groups.get_mut(group) {
            if matches!(g.state, GroupState::Stable | GroupState::CompletingRebalance) {
                Self::prepare_rebalance(g, now, &self.config, &mut out);
            }
        }
        out
    }

    /// Heartbeat: an error code, answered at once.
    pub fn heartbeat(
        &mut self,
        group: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now: u64,
    ) -> i16 {
        let Some(g) = self.groups.get_mut(group) else {
            return code::UNKNOWN_MEMBER_ID;
        };
        if g.state == GroupState::Dead {
            return code::COORDINATOR_NOT_AVAILABLE;
        }
        if !g.members.contains_key(member_id) {
            return unknown_or_fenced(g, instance_id);
        }
        let Some(m) = g.members.get_mut(member_id) else {
            return code::UNKNOWN_MEMBER_ID;
        };
        if instance_id.is_some() && m.instance_id.as_deref() != instance_id {
            return code::FENCED_INSTANCE_ID;
        }
        if generation != g.generation {
            return code::ILLEGAL_GENERATION;
        }
        m.last_heartbeat = now;
        match g.state {
            GroupState::PreparingRebalance => code::REBALANCE_IN_PROGRESS,
            GroupState::CompletingRebalance | GroupState::Stable => code::NONE,
            GroupState::Empty | GroupState::Dead => code::UNKNOWN_MEMBER_ID,
        }
    }

    /// LeaveGroup for a batch of (member id, instance id): an error per
    /// member, a group error, and the replies the departures release.
    pub fn leave(
        &mut self,
        group: &str,
        members: &[(String, Option<String>)],
        now: u64,
    ) -> (i16, Vec<i16>, Vec<Reply>) {
        let Some(g) = self.groups.get_mut(group) else {
            // Kafka's GroupCoordinatorService: a group not found is each
            // member's UNKNOWN_MEMBER_ID under a top-level NONE (the Java
            // AdminClient's removeMembersFromConsumerGroup reads them per
            // member; a top-level error fails its whole call).
            return (code::NONE, vec![code::UNKNOWN_MEMBER_ID; members.len()], Vec::new());
        };
        if g.state == GroupState::Dead {
            return (
                code::COORDINATOR_NOT_AVAILABLE,
                vec![code::COORDINATOR_NOT_AVAILABLE; members.len()],
                Vec::new(),
            );
        }
        let mut codes = Vec::with_capacity(members.len());
        let mut out = Vec::new();
        let mut any = false;
        // Static members by instance id, looked up once (a request of many
        // entries is not a scan of every member each).
        let mut by_instance: HashMap<String, String> = g
            .members
            .values()
            .filter_map(|m| m.instance_id.clone().map(|i| (i, m.id.clone())))
            .collect();
        for (member_id, instance_id) in members {
            // A static member may leave by instance id alone.
            let id = match instance_id {
                Some(inst) => by_instance.get(inst).cloned().filter(|id| g.members.contains_key(id)),
                None => Some(member_id.clone()).filter(|id| g.members.contains_key(id)),
            };
            let fenced =
                instance_id.is_some() && !member_id.is_empty() && id.as_deref().is_some_and(|i| i != member_id);
            match id {
                Some(_) if fenced => codes.push(code::FENCED_INSTANCE_ID),
                Some(id) => {
                    Self::drop_member(g, &id, &mut out);
                    if let Some(inst) = instance_id {
                        by_instance.remove(inst);
                    }
                    codes.push(code::NONE);
                    any = true;
                }
                None => {
                    if g.pending.remove(member_id).is_some() {
                        codes.push(code::NONE);
                    } else {
                        codes.push(code::UNKNOWN_MEMBER_ID);
                    }
                }
            }
        }
        if any {
            Self::after_departure(g, now, &self.config, &mut out);
        }
        (code::NONE, codes, out)
    }

    fn drop_member(g: &mut Group, id: &str, out: &mut Vec<Reply>) {
        if let Some(mut m) = g.remove_member(id) {
            if let Some(t) = m.awaiting_join.take() {
                out.push(Reply::Join(
                    t,
                    JoinResponse {
                        error: code::UNKNOWN_MEMBER_ID,
                        generation: -1,
                        member_id: id.to_string(),
                        ..JoinResponse::default()
                    },
                ));
            }
            if let Some(t) = m.awaiting_sync.take() {
                out.push(Reply::Sync(
                    t,
                    SyncResponse {
                        error: code::UNKNOWN_MEMBER_ID,
                        ..SyncResponse::default()
                    },
                ));
            }
        }
    }

    fn after_departure(g: &mut Group, now: u64, config: &GroupConfig, out: &mut Vec<Reply>) {
        match g.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                Self::prepare_rebalance(g, now, config, out);
                if g.members.is_empty() {
                    // Last member gone: straight to a new, empty generation.
                    g.rebalance_deadline = now;
                }
                Self::try_complete_join(g, now, out);
            }
            GroupState::PreparingRebalance => Self::try_complete_join(g, now, out),
            GroupState::Empty | GroupState::Dead => {}
        }
    }

    /// Time passes: expires members whose session ran out (members parked in
    /// a join or sync are kept alive) and, in CompletingRebalance past the
    /// rebalance timeout, members that have not synced; expires unused
    /// pending member ids; completes rebalances whose delay or timeout
    /// passed.
    pub fn tick(&mut self, now: u64) -> Vec<Reply> {
        let mut out = Vec::new();
        if now >= self.counted_at.saturating_add(RECOUNT_MS) || now < self.counted_at {
            self.recount(now);
        }
        let cfg = self.consumer_config();
        if self.consumer.tick(now, &cfg) > 0 {
            records_changed();
        }
        let config = self.config.clone();
        for g in self.groups.values_mut() {
            g.pending.retain(|_, deadline| *deadline > now);
            // The rebalance timeout passed in CompletingRebalance with the
            // assignment not in: whoever has not synced (the leader among
            // them) goes too.
            let sync_overdue = g.state == GroupState::CompletingRebalance && now >= g.rebalance_deadline;
            let mut expired: Vec<String> = Vec::new();
            for m in g.members.values().filter(|m| m.awaiting_sync.is_none()) {
                if m.awaiting_join.is_none() && m.last_heartbeat + m.session_timeout_ms <= now {
                    self.expired_sessions += 1;
                } else if sync_overdue {
                    self.expired_syncs += 1;
                } else {
                    continue;
                }
                expired.push(m.id.clone());
            }
            if !expired.is_empty() {
                for id in &expired {
                    Self::drop_member(g, id, &mut out);
                }
                Self::after_departure(g, now, &config, &mut out);
            }
            Self::try_complete_join(g, now, &mut out);
        }
        out
    }

    /// Groups that have been Empty longer than the offsets retention: the
    /// caller deletes their offsets; they are forgotten here.
    pub fn expire_empty_groups(&mut self, now: u64) -> Vec<String> {
        self.expire_empty_groups_unless(now, |_| false)
    }

    /// [`GroupCoordinator::expire_empty_groups`], but a group `in_use` says
    /// is used elsewhere (members of another protocol, recent commits) is
    /// kept, its retention starting again now. KIP-848 groups without
    /// members go as soon as `in_use` does not keep them (their offsets
    /// expire by commit time).
    pub fn expire_empty_groups_unless(&mut self, now: u64, in_use: impl Fn(&str) -> bool) -> Vec<String> {
        let retention = self.config.offsets_retention_ms;
        // KIP-848 groups without members: expired once `in_use` says
        // nothing was committed within the retention (Kafka's
        // ConsumerGroup.offsetExpirationCondition goes by commit time for
        // topics no member subscribes to: all of them, once empty) — they
        // were kept, with their offsets, for ever.
        let empty: Vec<String> = self
            .consumer
            .groups
            .iter()
            .filter(|(_, g)| g.members.is_empty())
            .map(|(n, _)| n.clone())
            .collect();
        let mut gone: Vec<String> = Vec::new();
        for n in empty {
            if !in_use(&n) {
                self.consumer.groups.remove(&n);
                gone.push(n);
            }
        }
        let due: Vec<String> = self
            .groups
            .values()
            .filter(|g| g.state == GroupState::Empty && g.empty_since + retention <= now)
            .map(|g| g.name.clone())
            .collect();
        for n in due {
            if in_use(&n) {
                if let Some(g) = self.groups.get_mut(&n) {
                    g.empty_since = now;
                }
            } else {
                self.groups.remove(&n);
                gone.push(n);
            }
        }
        if !gone.is_empty() {
            records_changed();
        }
        gone
    }

    /// Forgets Empty groups with no member id pending and no committed
    /// offsets (`has_offsets` says which have): nothing of theirs is left to
    /// keep (Kafka removes them at its next offsets-expiration pass).
    /// Returns how many.
    pub fn forget_unused_groups(&mut self, has_offsets: impl Fn(&str) -> bool) -> usize {
        let before = self.groups.len();
        self.groups
            .retain(|name, g| !(g.state == GroupState::Empty && g.pending.is_empty() && !has_offsets(name)));
        let consumer = self.consumer.forget_unused(&has_offsets);
        if self.groups.len() != before || consumer > 0 {
            records_changed();
        }
        before - self.groups.len() + consumer
    }

    /// Counts changes of what [`GroupCoordinator::records`] returns (it
    /// may count more: a change is never missed).
    pub fn record_changes(&self) -> u64 {
        RECORD_CHANGES.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Every group as a coordinator taking over would load it: a classic
    /// group as of its last completed rebalance (or emptied), a consumer
    /// group (KIP-848) as it is.
    pub fn records(&self) -> GroupRecords {
        let mut classic: Vec<GroupRecord> = self.groups.values().filter_map(|g| g.record.clone()).collect();
        classic.sort_by(|a, b| a.name.cmp(&b.name));
        GroupRecords {
            classic,
            consumer: self.consumer.records(),
        }
    }

    /// Replaces the groups (classic and consumer) with a master's [`GroupCoordinator::records`]
    /// (a replica keeps them to take over with): each Stable with its
    /// members' sessions starting at `now`, or Empty. How many.
    pub fn load_records(&mut self, records: GroupRecords, now: u64) -> usize {
        let n = records.len();
        self.groups = records
            .classic
            .into_iter()
            .map(|r| (r.name.clone(), r.load(now)))
            .collect();
        self.consumer.load_records(records.consumer, now);
        self.recount(now);
        // What this node ships if it becomes master again is what it holds
        // now, not what it encoded when it last was.
        records_changed();
        n
    }

    /// Every member's session starts again at `now` (a coordinator taking
    /// over: members could not reach it while it was not one).
    pub fn restart_sessions(&mut self, now: u64) {
        self.consumer.restart_sessions(now);
        for g in self.groups.values_mut() {
            for m in g.members.values_mut() {
                m.last_heartbeat = now;
            }
            // Both waits on members restart: the join's for members to
            // rejoin, the sync's for the leader's assignment (a node that
            // coordinates again after a spell as replica or fenced kept its
            // own groups and their old deadlines).
            if matches!(
                g.state,
                GroupState::PreparingRebalance | GroupState::CompletingRebalance
            ) {
                g.rebalance_deadline = now + g.max_rebalance_timeout();
            }
        }
    }

    /// Whether an OffsetCommit from (member, generation) is accepted: an
    /// error code. A commit with no member id and generation -1 (admin or
    /// standalone consumer) is accepted while the group has no members.
    pub fn validate_commit(&self, group: &str, member_id: &str, instance_id: Option<&str>, generation: i32) -> i16 {
        self.validate(group, member_id, instance_id, generation, false)
    }

    /// [`Self::validate_commit`] for a TxnOffsetCommit (v3+, a member's
    /// generation or epoch), as Kafka's validateTransactionalOffsetCommit:
    /// no REBALANCE_IN_PROGRESS while the group completes a rebalance (the
    /// offsets apply only when the transaction commits), and a consumer
    /// group's stale member epoch is ILLEGAL_GENERATION (the producer
    /// aborts and retries; STALE_MEMBER_EPOCH would be fatal to it).
    pub fn validate_txn_commit(&self, group: &str, member_id: &str, instance_id: Option<&str>, generation: i32) -> i16 {
        self.validate(group, member_id, instance_id, generation, true)
    }

    fn validate(&self, group: &str, member_id: &str, instance_id: Option<&str>, generation: i32, txn: bool) -> i16 {
        if let Some(c) = self.consumer.validate_commit(group, member_id, generation) {
            return if txn && c == crate::consumer::err::STALE_MEMBER_EPOCH {
                code::ILLEGAL_GENERATION
            } else {
                c
            };
        }
        let Some(g) = self.groups.get(group) else {
            // Kafka's handleCommitOffsets: a generation from a group that
            // is not there (expired, deleted, or lost with its coordinator)
            // is an older generation; a member id without one is unknown.
            return if generation >= 0 {
                code::ILLEGAL_GENERATION
            } else if member_id.is_empty() {
                code::NONE
            } else {
                code::UNKNOWN_MEMBER_ID
            };
        };
        match g.state {
            GroupState::Dead => code::COORDINATOR_NOT_AVAILABLE,
            GroupState::Empty => {
                if member_id.is_empty() && generation < 0 {
                    code::NONE
                } else {
                    code::UNKNOWN_MEMBER_ID
                }
            }
            _ if member_id.is_empty() && generation < 0 => {
                // Kafka accepts these only for groups without members.
                code::UNKNOWN_MEMBER_ID
            }
            state => {
                let Some(m) = g.members.get(member_id) else {
                    return unknown_or_fenced(g, instance_id);
                };
                if instance_id.is_some() && m.instance_id.as_deref() != instance_id {
                    return code::FENCED_INSTANCE_ID;
                }
                if generation != g.generation {
                    return code::ILLEGAL_GENERATION;
                }
                if state == GroupState::CompletingRebalance && !txn {
                    return code::REBALANCE_IN_PROGRESS;
                }
                code::NONE
            }
        }
    }

    /// (name, state, protocol type) of every known group.
    pub fn list(&self) -> Vec<(String, GroupState, String)> {
        let mut v: Vec<_> = self
            .groups
            .values()
            .map(|g| (g.name.clone(), g.state, g.protocol_type.clone().unwrap_or_default()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    pub fn describe(&self, group: &str) -> Option<GroupView> {
        let g = self.groups.get(group)?;
        let protocol = g.protocol.clone().unwrap_or_default();
        Some(GroupView {
            name: g.name.clone(),
            state: g.state,
            generation: g.generation,
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            protocol: if g.state == GroupState::Stable {
                protocol.clone()
            } else {
                String::new()
            },
            leader: g.leader.clone().unwrap_or_default(),
            members: g
                .members_in_join_order()
                .map(|m| MemberView {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: m.metadata(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        })
    }

    pub fn state(&self, group: &str) -> Option<GroupState> {
        self.groups.get(group).map(|g| g.state)
    }

    /// DeleteGroups: only groups without members. NONE when deleted (or
    /// unknown here but `has_offsets`), else NON_EMPTY_GROUP /
    /// GROUP_ID_NOT_FOUND. The caller deletes the offsets.
    pub fn delete(&mut self, group: &str, has_offsets: bool) -> i16 {
        if let Some(cg) = self.consumer.groups.get(group) {
            if !cg.members.is_empty() {
                return code::NON_EMPTY_GROUP;
            }
            self.consumer.groups.remove(group);
            records_changed();
            return code::NONE;
        }
        match self.groups.get(group).map(|g| g.state) {
            Some(GroupState::Empty) | Some(GroupState::Dead) => {
                self.groups.remove(group);
                records_changed();
                code::NONE
            }
            Some(_) => code::NON_EMPTY_GROUP,
            None if has_offsets => code::NONE,
            None => code::GROUP_ID_NOT_FOUND,
        }
    }

    /// Number of members of `group`.
    pub fn member_count(&self, group: &str) -> usize {
        self.groups.get(group).map_or(0, |g| g.members.len())
    }
}

/// The answer to a member's parked JoinGroup that its newer JoinGroup
/// replaced: REBALANCE_IN_PROGRESS, which makes a client that still waits
/// for it rejoin (Kafka answers a superseded join future the same way,
/// KAFKA-20938; before that it dropped the future and the request hung until
/// the client's timeout). The member keeps its id.
fn superseded_join(token: Token, member_id: &str) -> Reply {
    Reply::Join(
        token,
        JoinResponse {
            error: code::REBALANCE_IN_PROGRESS,
            generation: -1,
            member_id: member_id.to_string(),
            ..JoinResponse::default()
        },
    )
}

/// The answer to a member's parked SyncGroup that its newer SyncGroup
/// replaced (see [`superseded_join`]).
fn superseded_sync(token: Token) -> Reply {
    Reply::Sync(
        token,
        SyncResponse {
            error: code::REBALANCE_IN_PROGRESS,
            ..SyncResponse::default()
        },
    )
}

/// A request from an unknown member id: FENCED_INSTANCE_ID when its
/// instance id now belongs to another member (a replaced static member).
fn unknown_or_fenced(g: &Group, instance_id: Option<&str>) -> i16 {
    match instance_id {
        Some(inst) if g.members.values().any(|m| m.instance_id.as_deref() == Some(inst)) => code::FENCED_INSTANCE_ID,
        _ => code::UNKNOWN_MEMBER_ID,
    }
}
