//! The coordinator as tables of (state, event) → (state, replies).

use bytes::Bytes;

use crate::types::code::*;
use crate::*;

const SESSION: u64 = 10_000;
const REBALANCE: u64 = 30_000;

struct H {
    c: GroupCoordinator,
    now: u64,
    next_token: Token,
}

impl H {
    fn new() -> H {
        H {
            c: GroupCoordinator::new(GroupConfig::default()),
            now: 1_000_000,
            next_token: 1,
        }
    }

    fn token(&mut self) -> Token {
        self.next_token += 1;
        self.next_token
    }

    fn join_req(member: &str, protocols: &[(&str, &str)], instance: Option<&str>) -> JoinRequest {
        JoinRequest {
            group: "g".into(),
            member_id: member.into(),
            instance_id: instance.map(String::from),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: SESSION,
            rebalance_timeout_ms: REBALANCE,
            protocol_type: "consumer".into(),
            protocols: protocols
                .iter()
                .map(|(n, m)| (n.to_string(), Bytes::from(m.to_string())))
                .collect(),
            require_known_member_id: true,
            skip_assignment_supported: true,
        }
    }

    fn join(&mut self, member: &str) -> (Token, Vec<Reply>) {
        self.join_with(Self::join_req(member, &[("range", "meta")], None))
    }

    fn join_with(&mut self, req: JoinRequest) -> (Token, Vec<Reply>) {
        let t = self.token();
        let r = self.c.join(req, t, self.now);
        (t, r)
    }

    /// First join (MEMBER_ID_REQUIRED) then the real join; returns the id.
    fn new_member(&mut self) -> (String, Token, Vec<Reply>) {
        let (_, r) = self.join("");
        let Reply::Join(_, resp) = &r[0] else { panic!("{r:?}") };
        assert_eq!(resp.error, MEMBER_ID_REQUIRED);
        let id = resp.member_id.clone();
        let (t, r) = self.join(&id);
        (id, t, r)
    }

    fn sync(&mut self, member: &str, generation: i32, assignments: &[(&str, &str)]) -> (Token, Vec<Reply>) {
        let t = self.token();
        let r = self.c.sync(
            SyncRequest {
                group: "g".into(),
                member_id: member.into(),
                instance_id: None,
                generation,
                protocol_type: Some("consumer".into()),
                protocol_name: Some("range".into()),
                assignments: assignments
                    .iter()
                    .map(|(m, a)| (m.to_string(), Bytes::from(a.to_string())))
                    .collect(),
            },
            t,
            self.now,
        );
        (t, r)
    }

    /// Lets time pass in 100 ms ticks, as the frontend's timer does.
    fn advance(&mut self, ms: u64) -> Vec<Reply> {
        let end = self.now + ms;
        let mut out = Vec::new();
        while self.now < end {
            self.now = (self.now + 100).min(end);
            out.extend(self.c.tick(self.now));
        }
        out
    }

    fn state(&self) -> GroupState {
        self.c.state("g").unwrap_or(GroupState::Dead)
    }
}

fn join_reply(r: &[Reply], t: Token) -> JoinResponse {
    r.iter()
        .find_map(|x| match x {
            Reply::Join(tt, j) if *tt == t => Some(j.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no join reply for {t} in {r:?}"))
}

fn sync_reply(r: &[Reply], t: Token) -> SyncResponse {
    r.iter()
        .find_map(|x| match x {
            Reply::Sync(tt, s) if *tt == t => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no sync reply for {t} in {r:?}"))
}

/// A one-member group in Stable at generation 1.
fn stable_one() -> (H, String) {
    let mut h = H::new();
    let (a, ta, r) = h.new_member();
    assert!(r.is_empty(), "parked during the initial delay");
    let r = h.advance(3_000);
    assert_eq!(join_reply(&r, ta).generation, 1);
    let (ts, r) = h.sync(&a, 1, &[(&a, "A")]);
    assert_eq!(sync_reply(&r, ts).assignment, Bytes::from("A"));
    assert_eq!(h.state(), GroupState::Stable);
    (h, a)
}

#[test]
fn empty_first_join_needs_a_member_id_then_waits_the_initial_delay() {
    let mut h = H::new();
    let (_, r) = h.join("");
    let resp = join_reply(&r, h.next_token);
    assert_eq!(resp.error, MEMBER_ID_REQUIRED);
    assert!(resp.member_id.starts_with("c-"));
    assert_eq!(h.state(), GroupState::Empty);
    let (t, r) = h.join(&resp.member_id);
    assert!(r.is_empty());
    assert_eq!(h.state(), GroupState::PreparingRebalance);
    assert!(h.advance(2_999).is_empty());
    let r = h.advance(1);
    let j = join_reply(&r, t);
    assert_eq!(
        (j.error, j.generation, j.leader.as_str()),
        (NONE, 1, resp.member_id.as_str())
    );
    assert_eq!(j.members.len(), 1, "the leader sees all members");
    assert_eq!(h.state(), GroupState::CompletingRebalance);
}

#[test]
fn join_and_sync_table() {
    let (mut h, a) = stable_one();
    // (state Stable, follower join) → PreparingRebalance; no initial delay.
    let (b, tb, r) = h.new_member();
    assert!(r.is_empty());
    assert_eq!(h.state(), GroupState::PreparingRebalance);
    // (PreparingRebalance, heartbeat) → REBALANCE_IN_PROGRESS
    assert_eq!(h.c.heartbeat("g", &a, None, 1, h.now), REBALANCE_IN_PROGRESS);
    // (PreparingRebalance, sync) → REBALANCE_IN_PROGRESS
    let (ts, r) = h.sync(&a, 1, &[]);
    assert_eq!(sync_reply(&r, ts).error, REBALANCE_IN_PROGRESS);
    // (PreparingRebalance, last rejoin) → CompletingRebalance, all answered.
    let (ta, r) = h.join(&a);
    let ja = join_reply(&r, ta);
    let jb = join_reply(&r, tb);
    assert_eq!((ja.generation, jb.generation), (2, 2));
    assert_eq!(ja.leader, a);
    assert_eq!(ja.members.len(), 2);
    assert!(jb.members.is_empty());
    assert_eq!(h.state(), GroupState::CompletingRebalance);
    // (CompletingRebalance, heartbeat) → NONE
    assert_eq!(h.c.heartbeat("g", &b, None, 2, h.now), NONE);
    // (CompletingRebalance, old generation) → ILLEGAL_GENERATION
    assert_eq!(h.c.heartbeat("g", &b, None, 1, h.now), ILLEGAL_GENERATION);
    // (CompletingRebalance, commit) → REBALANCE_IN_PROGRESS
    assert_eq!(h.c.validate_commit("g", &b, None, 2), REBALANCE_IN_PROGRESS);
    // (CompletingRebalance, follower sync) → parked
    let (tsb, r) = h.sync(&b, 2, &[]);
    assert!(r.is_empty());
    // (CompletingRebalance, leader sync) → Stable, everyone answered.
    let (tsa, r) = h.sync(&a, 2, &[(&a, "PA"), (&b, "PB")]);
    assert_eq!(sync_reply(&r, tsa).assignment, Bytes::from("PA"));
    assert_eq!(sync_reply(&r, tsb).assignment, Bytes::from("PB"));
    assert_eq!(h.state(), GroupState::Stable);
    // (Stable, follower join with same metadata) → current generation, no rebalance.
    let (t, r) = h.join(&b);
    assert_eq!(join_reply(&r, t).generation, 2);
    assert_eq!(h.state(), GroupState::Stable);
    // (Stable, commit from current generation) → NONE; wrong generation → ILLEGAL_GENERATION.
    assert_eq!(h.c.validate_commit("g", &a, None, 2), NONE);
    assert_eq!(h.c.validate_commit("g", &a, None, 1), ILLEGAL_GENERATION);
    assert_eq!(h.c.validate_commit("g", "", None, -1), UNKNOWN_MEMBER_ID);
    // (Stable, sync) → current assignment.
    let (t, r) = h.sync(&b, 2, &[]);
    assert_eq!(sync_reply(&r, t).assignment, Bytes::from("PB"));
    // (Stable, leader join) → rebalance.
    let (_, r) = h.join(&a);
    assert!(r.is_empty());
    assert_eq!(h.state(), GroupState::PreparingRebalance);
}

#[test]
fn session_timeout_expires_a_silent_member_and_the_survivor_takes_over() {
    let (mut h, a) = stable_one();
    let (b, tb, _) = h.new_member();
    let (ta, r) = h.join(&a);
    assert_eq!(join_reply(&r, ta).generation, 2);
    join_reply(&r, tb);
    let (_, _) = h.sync(&b, 2, &[]);
    let (_, r) = h.sync(&a, 2, &[(&a, "x"), (&b, "y")]);
    assert_eq!(r.len(), 2);
    // a keeps heartbeating, b goes silent: after its session timeout b is
    // gone and a rebalance starts.
    let silent_since = h.now;
    while h.state() == GroupState::Stable {
        assert_eq!(h.c.heartbeat("g", &a, None, 2, h.now), NONE, "at {}", h.now);
        h.advance(1_000);
        assert!(h.now - silent_since <= SESSION + 1_000, "b never expired");
    }
    assert!(h.now - silent_since >= SESSION);
    assert_eq!(h.state(), GroupState::PreparingRebalance, "b expired");
    assert_eq!(h.c.expired(), (1, 0));
    assert_eq!(h.c.heartbeat("g", &b, None, 2, h.now), UNKNOWN_MEMBER_ID);
    assert_eq!(h.c.heartbeat("g", &a, None, 2, h.now), REBALANCE_IN_PROGRESS);
    let (ta, r) = h.join(&a);
    let j = join_reply(&r, ta);
    assert_eq!((j.generation, j.members.len()), (3, 1));
}

#[test]
fn rebalance_timeout_drops_members_that_do_not_rejoin() {
    let (mut h, a) = stable_one();
    let (_b, tb, _) = h.new_member();
    // a heartbeats (told to rejoin) but never rejoins; b's parked join keeps
    // b alive. At the rebalance timeout a is dropped.
    let mut r = Vec::new();
    for _ in 0..(REBALANCE / 1_000) {
        assert!(r.is_empty(), "completed early");
        assert_eq!(h.c.heartbeat("g", &a, None, 1, h.now), REBALANCE_IN_PROGRESS);
        r = h.advance(1_000);
    }
    let j = join_reply(&r, tb);
    assert_eq!((j.generation, j.members.len()), (2, 1), "a was dropped");
    assert_eq!(h.c.heartbeat("g", &a, None, 1, h.now), UNKNOWN_MEMBER_ID);
}

#[test]
fn a_leader_that_never_syncs_is_dropped_at_the_rebalance_timeout() {
    let (mut h, a) = stable_one();
    let (b, tb, r) = h.new_member();
    assert!(r.is_empty());
    let (ta, r) = h.join(&a);
    let ja = join_reply(&r, ta);
    let jb = join_reply(&r, tb);
    assert_eq!((ja.generation, ja.leader.as_str()), (2, a.as_str()));
    assert_eq!(h.state(), GroupState::CompletingRebalance);
    // b syncs and waits; a keeps heartbeating and never sends its sync.
    let (ts, r) = h.sync(&b, jb.generation, &[]);
    assert!(r.is_empty(), "b waits for the leader");
    let mut r = Vec::new();
    for _ in 0..(REBALANCE / 1_000) {
        assert!(r.is_empty(), "gave up early: {r:?}");
        assert_eq!(h.c.heartbeat("g", &a, None, 2, h.now), NONE);
        r = h.advance(1_000);
    }
    assert_eq!(sync_reply(&r, ts).error, REBALANCE_IN_PROGRESS);
    assert_eq!(h.state(), GroupState::PreparingRebalance);
    assert_eq!(h.c.expired(), (0, 1), "a dropped for its sync, b kept");
    assert_eq!(h.c.heartbeat("g", &a, None, 2, h.now), UNKNOWN_MEMBER_ID);
    let (tb, r) = h.join(&b);
    let j = join_reply(&r, tb);
    assert_eq!((j.generation, j.members.len(), j.leader.as_str()), (3, 1, b.as_str()));
}

#[test]
fn coordinating_again_restarts_the_wait_for_the_leaders_sync() {
    let (mut h, a) = stable_one();
    let (b, tb, _) = h.new_member();
    let (ta, r) = h.join(&a);
    join_reply(&r, ta);
    let jb = join_reply(&r, tb);
    let (ts, r) = h.sync(&b, jb.generation, &[]);
    assert!(r.is_empty());
    // This node stops coordinating (no ticks) past the rebalance timeout,
    // then coordinates again: the leader gets a full timeout to sync.
    h.now += REBALANCE + 5_000;
    h.c.restart_sessions(h.now);
    let r = h.advance(1_000);
    assert!(r.is_empty(), "dropped at once: {r:?}");
    assert_eq!(h.state(), GroupState::CompletingRebalance);
    let (_, r) = h.sync(&a, 2, &[(&a, "x"), (&b, "y")]);
    assert_eq!(sync_reply(&r, ts).assignment, Bytes::from("y"));
    assert_eq!(h.c.expired(), (0, 0));
}

#[test]
fn leaving_members_rebalance_and_the_last_one_empties_the_group() {
    let (mut h, a) = stable_one();
    let (code_, codes, r) = h.c.leave("g", &[(a.clone(), None), ("ghost".into(), None)], h.now);
    assert_eq!(code_, NONE);
    assert_eq!(codes, vec![NONE, UNKNOWN_MEMBER_ID]);
    assert!(r.is_empty());
    assert_eq!(h.state(), GroupState::Empty);
    assert_eq!(h.c.heartbeat("g", &a, None, 1, h.now), UNKNOWN_MEMBER_ID);
    assert_eq!(
        h.c.validate_commit("g", "", None, -1),
        NONE,
        "admin commits to an empty group"
    );
    assert_eq!(h.c.validate_commit("g", &a, None, 1), UNKNOWN_MEMBER_ID);
    assert_eq!(h.c.delete("g", true), NONE);
    assert_eq!(h.c.state("g"), None);
}

#[test]
fn non_empty_groups_cannot_be_deleted() {
    let (mut h, _a) = stable_one();
    assert_eq!(h.c.delete("g", true), NON_EMPTY_GROUP);
    assert_eq!(h.c.delete("nope", false), GROUP_ID_NOT_FOUND);
}

#[test]
fn bad_joins() {
    let mut h = H::new();
    let mut req = H::join_req("", &[("range", "m")], None);
    req.session_timeout_ms = 1_000;
    let (t, r) = h.join_with(req);
    assert_eq!(join_reply(&r, t).error, INVALID_SESSION_TIMEOUT);
    let (t, r) = h.join("someone");
    assert_eq!(join_reply(&r, t).error, UNKNOWN_MEMBER_ID);
    let (_h2, _) = (0, 0);
    let (mut h, _a) = stable_one();
    let mut req = H::join_req("", &[("roundrobin", "m")], None);
    req.require_known_member_id = false;
    let (t, r) = h.join_with(req);
    assert_eq!(join_reply(&r, t).error, INCONSISTENT_GROUP_PROTOCOL);
}

#[test]
fn protocol_is_chosen_by_vote_among_common_ones() {
    let mut h = H::new();
    let mut first = H::join_req("", &[("cooperative-sticky", "x"), ("range", "y")], None);
    first.require_known_member_id = false;
    let (t1, _) = h.join_with(first);
    let mut second = H::join_req("", &[("range", "y"), ("cooperative-sticky", "x")], None);
    second.require_known_member_id = false;
    let (t2, _) = h.join_with(second.clone());
    let mut third = second;
    third.protocols = vec![("range".into(), Bytes::from("z"))];
    let (t3, _) = h.join_with(third);
    let r = h.advance(10_000);
    for t in [t1, t2, t3] {
        assert_eq!(join_reply(&r, t).protocol_name.as_deref(), Some("range"));
    }
}

#[test]
fn initial_delay_is_extended_while_members_arrive() {
    let mut h = H::new();
    let (_a, ta, _) = h.new_member();
    assert!(h.advance(2_000).is_empty());
    let (_b, tb, _) = h.new_member();
    // The first delay ends at +3 s; b arrived during it, so one more delay.
    assert!(h.advance(1_000).is_empty());
    assert!(h.advance(2_999).is_empty());
    let r = h.advance(1);
    assert_eq!(join_reply(&r, ta).generation, 1);
    assert_eq!(join_reply(&r, tb).generation, 1);
}

#[test]
fn static_member_rejoin_keeps_generation_and_fences_the_old_id() {
    let mut h = H::new();
    let (t, _) = h.join_with(H::join_req("", &[("range", "m")], Some("inst-1")));
    let r = h.advance(3_000);
    let j = join_reply(&r, t);
    let old = j.member_id.clone();
    let (ts, r) = h.sync(&old, 1, &[(&old, "A")]);
    sync_reply(&r, ts);
    assert_eq!(h.state(), GroupState::Stable);
    // Restarted with the same instance id and no member id.
    let (t, r) = h.join_with(H::join_req("", &[("range", "m")], Some("inst-1")));
    let j = join_reply(&r, t);
    assert_eq!(j.error, NONE);
    assert_eq!(j.generation, 1, "no rebalance");
    assert_ne!(j.member_id, old);
    assert_eq!(h.state(), GroupState::Stable);
    assert_eq!(h.c.heartbeat("g", &old, Some("inst-1"), 1, h.now), FENCED_INSTANCE_ID);
    assert_eq!(h.c.heartbeat("g", &j.member_id, Some("inst-1"), 1, h.now), NONE);
}

/// A group of a static leader ("inst-1", joined first) and a dynamic
/// member, Stable at generation 1: (harness, static id, dynamic id).
fn stable_static_and_dynamic() -> (H, String, String) {
    let mut h = H::new();
    // Static members have sessions longer than a rebalance (a restart
    // fits in them).
    let mut req = H::join_req("", &[("range", "owned=none")], Some("inst-1"));
    req.session_timeout_ms = 3 * REBALANCE;
    let (ts, _) = h.join_with(req);
    let (d, td, _) = h.new_member();
    let r = h.advance(7_000);
    let s = join_reply(&r, ts).member_id;
    assert_eq!(join_reply(&r, td).generation, 1);
    let (tl, r) = h.sync(&s, 1, &[(&s, "S"), (&d, "D")]);
    sync_reply(&r, tl);
    assert_eq!(h.state(), GroupState::Stable);
    (h, s, d)
}

#[test]
fn a_static_member_returning_with_other_metadata_keeps_the_group_stable_and_its_record() {
    let (mut h, s, d) = stable_static_and_dynamic();
    let records = h.c.record_changes();
    // Restarted: the same instance id, its metadata now different (a
    // cooperative client's owned partitions), the protocol the same.
    let (t, r) = h.join_with(H::join_req("", &[("range", "owned=p0,p1")], Some("inst-1")));
    let j = join_reply(&r, t);
    assert_eq!((j.error, j.generation), (NONE, 1), "no rebalance");
    assert_eq!(h.state(), GroupState::Stable);
    assert!(j.durable, "answered once the record is replicated");
    // v9: the returning leader is told to skip the assignment.
    assert_eq!(j.leader, j.member_id);
    assert!(j.skip_assignment);
    assert_eq!(j.members.len(), 2);
    let (ts, r) = h.sync(&j.member_id, 1, &[]);
    assert_eq!(sync_reply(&r, ts).assignment, Bytes::from("S"));
    // The record names the new id: a coordinator taking over knows it.
    assert!(h.c.record_changes() > records);
    let mut next = GroupCoordinator::new(GroupConfig::default());
    next.load_records(h.c.records(), 0);
    assert_eq!(next.heartbeat("g", &j.member_id, Some("inst-1"), 1, 0), NONE);
    assert_eq!(next.heartbeat("g", &s, Some("inst-1"), 1, 0), FENCED_INSTANCE_ID);
    assert_eq!(
        h.c.heartbeat("g", &d, None, 1, h.now),
        NONE,
        "the other member undisturbed"
    );
    // Before v9 the returning leader is answered as a follower: the leader
    // as it was, no members.
    let mut req = H::join_req("", &[("range", "owned=p0")], Some("inst-1"));
    req.skip_assignment_supported = false;
    let (t, r) = h.join_with(req);
    let j2 = join_reply(&r, t);
    assert_eq!((j2.error, j2.generation), (NONE, 1));
    assert_eq!(j2.leader, j.member_id);
    assert!(j2.members.is_empty() && !j2.skip_assignment);
    // Its replaced id joining again with the instance id is fenced.
    let (t, r) = h.join_with(H::join_req(&j.member_id, &[("range", "x")], Some("inst-1")));
    assert_eq!(join_reply(&r, t).error, FENCED_INSTANCE_ID);
}

#[test]
fn a_static_member_that_has_not_rejoined_stays_through_a_rebalance() {
    let (mut h, s, d) = stable_static_and_dynamic();
    // A third member joins; the static member is restarting and does not
    // rejoin within the rebalance timeout, the dynamic one does.
    let (_e, te, _) = h.new_member();
    let (td, _) = h.join_with(H::join_req(&d, &[("range", "meta")], None));
    let r = h.advance(REBALANCE + 1_000);
    let je = join_reply(&r, te);
    let jd = join_reply(&r, td);
    assert_eq!(je.generation, 2);
    // Still a member, named to the leader (a member that rejoined) for
    // the assignment.
    let leader = if jd.members.is_empty() { &je } else { &jd };
    assert_eq!(leader.members.len(), 3, "{leader:?}");
    assert!(leader
        .members
        .iter()
        .any(|(id, inst, _)| *id == s && inst.as_deref() == Some("inst-1")));
    assert_ne!(leader.leader, s);
    // It comes back: same generation, no further rebalance once Stable.
    let (tl, _) = h.sync(&leader.leader, 2, &[(&s, "S2")]);
    let _ = tl;
    let other = if leader.leader == je.member_id { &jd } else { &je };
    h.sync(&other.member_id, 2, &[]);
    assert_eq!(h.state(), GroupState::Stable);
    let mut back = H::join_req("", &[("range", "owned=none")], Some("inst-1"));
    back.session_timeout_ms = 3 * REBALANCE;
    let (t, r) = h.join_with(back);
    let j = join_reply(&r, t);
    assert_eq!((j.error, j.generation), (NONE, 2));
    let (ts, r) = h.sync(&j.member_id, 2, &[]);
    assert_eq!(sync_reply(&r, ts).assignment, Bytes::from("S2"));
    // Only static members left and none rejoins: the join waits, then
    // their sessions end it.
    let mut h = H::new();
    let (t1, _) = h.join_with(H::join_req("", &[("range", "m")], Some("inst-a")));
    let r = h.advance(3_000);
    let a = join_reply(&r, t1).member_id;
    let (ts, r) = h.sync(&a, 1, &[(&a, "A")]);
    sync_reply(&r, ts);
    h.c.force_rebalance("g", h.now);
    h.advance(REBALANCE + 1_000);
    assert_ne!(h.state(), GroupState::CompletingRebalance, "no leader that rejoined");
    h.advance(SESSION);
    assert_eq!(h.state(), GroupState::Empty);
}

#[test]
fn transactional_offset_commits_are_validated_as_kafka_does() {
    let (mut h, a) = stable_one();
    let (b, _tb, _) = h.new_member();
    let (ta, mut r) = h.join(&a);
    r.extend(h.advance(1_000));
    let _ = join_reply(&r, ta);
    assert_eq!(h.state(), GroupState::CompletingRebalance);
    // A plain commit waits for the rebalance; a transactional one does not.
    assert_eq!(h.c.validate_commit("g", &b, None, 2), REBALANCE_IN_PROGRESS);
    assert_eq!(h.c.validate_txn_commit("g", &b, None, 2), NONE);
    assert_eq!(h.c.validate_txn_commit("g", &b, None, 1), ILLEGAL_GENERATION);
    // A consumer group (KIP-848): a stale member epoch is ILLEGAL_GENERATION
    // for a transaction (STALE_MEMBER_EPOCH for a plain commit).
    let cfg = crate::consumer::ConsumerConfig {
        session_timeout_ms: SESSION,
        heartbeat_interval_ms: 1_000,
        max_size: 0,
        max_subscribed_topics: 0,
    };
    let topics = |t: &str| (t == "t").then_some(2u32);
    let r = h.c.consumer.heartbeat(
        crate::consumer::HeartbeatRequest {
            group: "k".into(),
            member_epoch: 0,
            rebalance_timeout_ms: 30_000,
            subscribed_topics: Some(vec!["t".into()]),
            owned: Some(Vec::new()),
            ..crate::consumer::HeartbeatRequest::default()
        },
        h.now,
        &topics,
        &cfg,
        true,
    );
    assert_eq!(r.error, NONE);
    let stale = r.member_epoch - 1;
    assert_eq!(
        h.c.validate_commit("k", &r.member_id, None, stale),
        crate::consumer::err::STALE_MEMBER_EPOCH
    );
    assert_eq!(
        h.c.validate_txn_commit("k", &r.member_id, None, stale),
        ILLEGAL_GENERATION
    );
    assert_eq!(h.c.validate_txn_commit("k", &r.member_id, None, r.member_epoch), NONE);
}

#[test]
fn v3_joins_get_a_member_id_at_once() {
    let mut h = H::new();
    let mut req = H::join_req("", &[("range", "m")], None);
    req.require_known_member_id = false;
    let (t, r) = h.join_with(req);
    assert!(r.is_empty());
    let r = h.advance(3_000);
    let j = join_reply(&r, t);
    assert_eq!(j.error, NONE);
    assert!(!j.member_id.is_empty());
}

#[test]
fn pending_member_ids_expire() {
    let mut h = H::new();
    let (_, r) = h.join("");
    let id = join_reply(&r, h.next_token).member_id;
    h.advance(SESSION + 1);
    let (t, r) = h.join(&id);
    assert_eq!(join_reply(&r, t).error, UNKNOWN_MEMBER_ID);
}

#[test]
fn an_emptied_group_keeps_its_protocol_type() {
    let (mut h, a) = stable_one();
    h.c.leave("g", &[(a, None)], h.now);
    assert_eq!(
        h.c.list(),
        vec![("g".to_string(), GroupState::Empty, "consumer".to_string())]
    );
    assert_eq!(h.c.describe("g").map(|v| v.protocol_type), Some("consumer".to_string()));
}

#[test]
fn empty_groups_expire_after_retention() {
    let (mut h, a) = stable_one();
    h.c.leave("g", &[(a, None)], h.now);
    assert!(h.c.expire_empty_groups(h.now + 1000).is_empty());
    let later = h.now + GroupConfig::default().offsets_retention_ms;
    assert_eq!(h.c.expire_empty_groups(later), vec!["g".to_string()]);
}

/// An Empty group another protocol's members use (a group moved from Kafka
/// to RocketMQ clients) is not expired; its retention starts again.
#[test]
fn an_empty_group_used_elsewhere_is_kept() {
    let (mut h, a) = stable_one();
    h.c.leave("g", &[(a, None)], h.now);
    let retention = GroupConfig::default().offsets_retention_ms;
    let later = h.now + retention;
    assert!(h.c.expire_empty_groups_unless(later, |g| g == "g").is_empty());
    assert!(
        h.c.expire_empty_groups(later + retention - 1).is_empty(),
        "retention restarted"
    );
    assert_eq!(h.c.expire_empty_groups(later + retention), vec!["g".to_string()]);
}

#[test]
fn a_group_beyond_max_group_size_refuses_new_members_only() {
    let mut h = H::new();
    h.c = GroupCoordinator::new(GroupConfig {
        max_group_size: 2,
        initial_rebalance_delay_ms: 0,
        ..GroupConfig::default()
    });
    let (a, _, _) = h.new_member();
    let (b, _, _) = h.new_member();
    // A third id is not even handed out.
    let (t, r) = h.join("");
    assert_eq!(join_reply(&r, t).error, GROUP_MAX_SIZE_REACHED);
    // Known members still rejoin.
    let (t, r) = h.join(&a);
    let errors: Vec<i16> = r
        .iter()
        .filter_map(|x| match x {
            Reply::Join(tt, j) if *tt == t => Some(j.error),
            _ => None,
        })
        .collect();
    assert!(!errors.contains(&GROUP_MAX_SIZE_REACHED), "{errors:?}");
    assert_eq!(h.c.member_count("g"), 2, "{b} and {a} stay");
    assert_eq!(h.c.refused(), (0, 1, 0));
}

#[test]
fn max_groups_refuses_a_new_group_until_unused_ones_are_forgotten() {
    let mut c = GroupCoordinator::new(GroupConfig {
        max_groups: 2,
        ..GroupConfig::default()
    });
    let mut req = H::join_req("", &[("range", "m")], None);
    req.require_known_member_id = true;
    for (i, g) in ["g1", "g2", "g3"].iter().enumerate() {
        req.group = g.to_string();
        let r = c.join(req.clone(), i as u64 + 1, 1_000);
        let e = join_reply(&r, i as u64 + 1).error;
        assert_eq!(
            e,
            if i < 2 {
                MEMBER_ID_REQUIRED
            } else {
                COORDINATOR_NOT_AVAILABLE
            },
            "{g}"
        );
    }
    assert_eq!(c.refused(), (1, 0, 0));
    // Pending ids keep their groups until they lapse; then a group without
    // offsets is forgotten and one with offsets kept.
    assert_eq!(c.forget_unused_groups(|_| false), 0);
    let _ = c.tick(1_000 + SESSION + 1);
    assert_eq!(c.forget_unused_groups(|g| g == "g1"), 1);
    assert_eq!(c.group_count(), 1);
    req.group = "g3".into();
    let r = c.join(req, 9, 1_000 + SESSION + 2);
    assert_eq!(join_reply(&r, 9).error, MEMBER_ID_REQUIRED);
}

// A member that re-sends a request while its earlier one is parked (its
// client timed out and reconnected, or two clients share a member id): the
// earlier request is answered REBALANCE_IN_PROGRESS at once — the client
// rejoins on it — as Kafka does since KAFKA-20938, instead of staying parked
// (and holding its connection) until nothing ever answers it.

#[test]
fn a_rejoin_while_the_first_join_is_parked_answers_the_first() {
    let (mut h, a) = stable_one();
    // (Stable, new member) → PreparingRebalance; b's join is parked.
    let (b, tb1, r) = h.new_member();
    assert!(r.is_empty());
    // (PreparingRebalance, b joins again) → the first join answered, the
    // second parked in its place.
    let (tb2, r) = h.join(&b);
    let first = join_reply(&r, tb1);
    assert_eq!(first.error, REBALANCE_IN_PROGRESS);
    assert_eq!(first.member_id, b, "the member keeps its id");
    assert!(!r.iter().any(|x| x.token() == tb2), "the retry is parked: {r:?}");
    assert_eq!(h.state(), GroupState::PreparingRebalance);
    // The rebalance still completes on the retry, and only the retry.
    let (ta, r) = h.join(&a);
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!(join_reply(&r, ta).generation, 2);
    assert_eq!(join_reply(&r, tb2).generation, 2);
    assert_eq!(h.c.superseded(), (1, 0));
}

#[test]
fn a_rejoin_during_the_initial_delay_answers_the_first() {
    let mut h = H::new();
    let (a, t1, r) = h.new_member();
    assert!(r.is_empty(), "parked during the initial delay");
    let (t2, r) = h.join(&a);
    assert_eq!(join_reply(&r, t1).error, REBALANCE_IN_PROGRESS);
    assert_eq!(r.len(), 1);
    let r = h.advance(3_000);
    assert_eq!(join_reply(&r, t2).generation, 1);
    assert!(!r.iter().any(|x| x.token() == t1), "answered twice: {r:?}");
}

#[test]
fn a_resent_sync_while_the_first_is_parked_answers_the_first() {
    let (mut h, a) = stable_one();
    let (b, tb, _) = h.new_member();
    let (ta, r) = h.join(&a);
    join_reply(&r, ta);
    join_reply(&r, tb);
    assert_eq!(h.state(), GroupState::CompletingRebalance);
    // (CompletingRebalance, follower sync) → parked; again → the first answered.
    let (ts1, r) = h.sync(&b, 2, &[]);
    assert!(r.is_empty());
    let (ts2, r) = h.sync(&b, 2, &[]);
    assert_eq!(sync_reply(&r, ts1).error, REBALANCE_IN_PROGRESS);
    assert_eq!(r.len(), 1, "the retry is parked: {r:?}");
    // (CompletingRebalance, leader sync) → the retry gets its assignment.
    let (tsa, r) = h.sync(&a, 2, &[(&a, "PA"), (&b, "PB")]);
    assert_eq!(sync_reply(&r, tsa).assignment, Bytes::from("PA"));
    assert_eq!(sync_reply(&r, ts2).assignment, Bytes::from("PB"));
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!(h.state(), GroupState::Stable);
    assert_eq!(h.c.superseded(), (0, 1));
}

/// Every parked request gets exactly one answer, whatever the order of
/// retries, leaves and timeouts.
#[test]
fn every_parked_request_is_answered_once() {
    let (mut h, a) = stable_one();
    let (b, tb1, _) = h.new_member();
    let (tb2, r1) = h.join(&b);
    let (tb3, r2) = h.join(&b);
    // a never rejoins: the rebalance timeout completes the join with b alone.
    let r3 = h.advance(REBALANCE + 100);
    let all: Vec<Reply> = r1.into_iter().chain(r2).chain(r3).collect();
    for t in [tb1, tb2, tb3] {
        assert_eq!(all.iter().filter(|x| x.token() == t).count(), 1, "token {t}: {all:?}");
    }
    assert_eq!(join_reply(&all, tb3).generation, 2);
    assert_eq!(join_reply(&all, tb3).leader, b);
    assert_eq!(h.c.heartbeat("g", &a, None, 1, h.now), UNKNOWN_MEMBER_ID);
}

#[test]
fn a_coordinator_taking_over_keeps_members_generation_and_assignment() {
    let (mut h, a) = stable_one();
    let records = h.c.records();
    // What a replica receives: the members' metadata and assignment as
    // base64, not arrays of numbers.
    let (wire, consumer) = records.encode();
    assert!(consumer.is_empty(), "no consumer groups, no second part");
    let text = String::from_utf8_lossy(&wire).into_owned();
    assert!(text.contains(r#""assignment":"QQ==""#), "{text}");
    let got = GroupRecords::decode(&wire, None);
    assert_eq!(got.as_ref(), Ok(&records));
    // A replica loads the records; its clock is its own.
    let mut next = GroupCoordinator::new(GroupConfig::default());
    let later = 50;
    assert_eq!(got.map(|r| next.load_records(r, later)), Ok(1));
    assert_eq!(next.state("g"), Some(GroupState::Stable));
    assert_eq!(next.validate_commit("g", &a, None, 1), NONE);
    assert_eq!(next.validate_commit("g", &a, None, 0), ILLEGAL_GENERATION);
    assert_eq!(next.heartbeat("g", &a, None, 1, later), NONE);
    let view = next.describe("g").map(|v| v.members.len());
    assert_eq!(view, Some(1));
    // Sessions run from when it took over.
    next.restart_sessions(later + 5_000);
    assert!(next.tick(later + 5_000 + SESSION - 100).is_empty());
    assert_eq!(next.state("g"), Some(GroupState::Stable));
    next.tick(later + 5_000 + SESSION);
    assert_eq!(
        next.state("g"),
        Some(GroupState::Empty),
        "its only member's session ran out"
    );

    // A rebalance in progress is not what is kept: the last completed one is.
    let before = h.c.record_changes();
    let (_b, _, _) = h.new_member();
    assert_eq!(h.state(), GroupState::PreparingRebalance);
    assert_eq!(h.c.records(), records);
    // The group emptied: kept as Empty with its generation.
    h.c.leave("g", &[(a.clone(), None)], h.now);
    h.advance(REBALANCE + 1_000);
    assert_eq!(h.state(), GroupState::Empty);
    assert!(h.c.record_changes() > before);
    let mut third = GroupCoordinator::new(GroupConfig::default());
    let emptied = GroupRecords::decode(&h.c.records().encode().0, None);
    assert_eq!(emptied.map(|r| third.load_records(r, 0)), Ok(1));
    assert_eq!(third.state("g"), Some(GroupState::Empty));
    assert!(GroupRecords::decode(b"not json", None).is_err());
    // An older master's form (numbers) is still read.
    let old_form = text.replace(r#""assignment":"QQ==""#, r#""assignment":[65]"#);
    assert_eq!(
        GroupRecords::decode(old_form.as_bytes(), None),
        Ok(records.clone()),
        "{old_form}"
    );
    // Loading counts as a change: a node promoted again ships what it holds.
    let v = third.record_changes();
    third.load_records(records.clone(), 0);
    assert!(third.record_changes() > v);
    // A member's metadata that is not base64 is refused whole.
    let bad = text.replacen("\"assignment\":\"", "\"assignment\":\"!", 1);
    assert!(GroupRecords::decode(bad.as_bytes(), None).is_err(), "{bad}");
}

/// A KIP-848 member "m1" joining `group` (epoch 0), subscribed to "t".
fn joining(group: &str) -> crate::consumer::HeartbeatRequest {
    crate::consumer::HeartbeatRequest {
        group: group.into(),
        member_id: "m1".into(),
        member_epoch: 0,
        rebalance_timeout_ms: 30_000,
        subscribed_topics: Some(vec!["t".into()]),
        owned: Some(Vec::new()),
        ..Default::default()
    }
}

#[test]
fn consumer_groups_go_to_a_coordinator_taking_over_with_the_classic_ones() -> Result<(), String> {
    let (mut h, _a) = stable_one();
    let (_, none) = h.c.records().encode();
    assert!(none.is_empty(), "without consumer groups, no second part");
    let v = h.c.record_changes();
    let topics = |t: &str| (t == "t").then_some(4u32);
    let r = h.c.consumer_heartbeat(joining("cg"), h.now, &topics);
    assert_eq!((r.error, r.member_epoch), (NONE, 1));
    assert!(h.c.record_changes() > v, "a member joining is a change to ship");
    let records = h.c.records();
    let (classic, consumer) = records.encode();
    assert_eq!(GroupRecords::decode(&classic, Some(&consumer)).as_ref(), Ok(&records));
    // The classic part alone is what a replica of an older version reads:
    // the classic groups' array, as before.
    let older: Result<Vec<serde_json::Value>, _> = serde_json::from_slice(&classic);
    assert_eq!(older.map(|v| v.len()).ok(), Some(1));
    let mut next = GroupCoordinator::new(GroupConfig::default());
    assert_eq!(
        GroupRecords::decode(&classic, Some(&consumer)).map(|r| next.load_records(r, 7)),
        Ok(2)
    );
    assert_eq!(next.state("g"), Some(GroupState::Stable));
    let g = next.consumer.groups.get("cg").ok_or("the consumer group")?;
    assert_eq!(
        (g.epoch, g.members["m1"].epoch, g.members["m1"].assigned.len()),
        (1, 1, 4)
    );
    Ok(())
}

/// Only a member joining (epoch 0) turns an empty classic group into a
/// consumer group: a leave (-1) or a stale heartbeat naming it leaves it
/// as it is (it took the group away, its offsets then tracked by none).
#[test]
fn only_a_joining_heartbeat_converts_an_empty_classic_group() {
    let (mut h, a) = stable_one();
    h.c.leave("g", &[(a.clone(), None)], h.now);
    h.advance(REBALANCE + 1_000);
    assert_eq!(h.state(), GroupState::Empty);
    let topics = |t: &str| (t == "t").then_some(4u32);
    for epoch in [-1, -2, 5] {
        let r = h.c.consumer_heartbeat(
            crate::consumer::HeartbeatRequest {
                group: "g".into(),
                member_id: "m1".into(),
                member_epoch: epoch,
                ..Default::default()
            },
            h.now,
            &topics,
        );
        assert_ne!(r.error, NONE, "epoch {epoch}");
        assert_eq!(
            h.c.state("g"),
            Some(GroupState::Empty),
            "epoch {epoch} took the classic group away"
        );
    }
    let r = h.c.consumer_heartbeat(joining("g"), h.now, &topics);
    assert_eq!((r.error, r.member_epoch), (NONE, 1));
    assert_eq!(h.c.state("g"), None, "now a consumer group");
}

/// An empty KIP-848 group is expired (the caller deletes its offsets)
/// once nothing keeps it — no recent commit, no member elsewhere — not kept
/// with its offsets for ever; one with members is never.
#[test]
fn empty_consumer_groups_expire_when_nothing_keeps_them() {
    let mut c = GroupCoordinator::new(GroupConfig::default());
    let topics = |t: &str| (t == "t").then_some(2u32);
    let beat = |c: &mut GroupCoordinator, group: &str, epoch: i32| {
        let req = match epoch {
            0 => joining(group),
            _ => crate::consumer::HeartbeatRequest {
                group: group.into(),
                member_id: "m1".into(),
                member_epoch: epoch,
                ..Default::default()
            },
        };
        c.consumer_heartbeat(req, 1_000, &topics)
    };
    assert_eq!(beat(&mut c, "left", 0).error, NONE);
    assert_eq!(beat(&mut c, "live", 0).error, NONE);
    assert_eq!(beat(&mut c, "left", -1).error, NONE);
    assert!(
        c.expire_empty_groups_unless(2_000, |_| true).is_empty(),
        "kept while in use"
    );
    assert!(c.consumer.groups.contains_key("left"));
    assert_eq!(c.expire_empty_groups_unless(3_000, |_| false), vec!["left".to_string()]);
    assert!(!c.consumer.groups.contains_key("left"));
    assert!(c.consumer.groups.contains_key("live"), "a group with members stays");
}

#[test]
fn a_join_listing_too_many_protocols_is_refused_and_a_repeated_one_counts_once() {
    let mut c = GroupCoordinator::new(GroupConfig {
        max_member_protocols: 3,
        initial_rebalance_delay_ms: 0,
        ..GroupConfig::default()
    });
    let many: Vec<(String, String)> = (0..4).map(|i| (format!("p{i}"), "m".to_string())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let mut req = H::join_req("", &many, None);
    req.require_known_member_id = false;
    let r = c.join(req, 1, 1_000);
    assert_eq!(join_reply(&r, 1).error, INCONSISTENT_GROUP_PROTOCOL);
    assert_eq!(c.refused(), (0, 0, 1));
    assert_eq!(c.member_count("g"), 0);
    // Three listed, one of them twice: within the limit, the group forms
    // on the first listed and the member's list holds each name once.
    let mut req = H::join_req("", &[("range", "first"), ("range", "again"), ("roundrobin", "m")], None);
    req.require_known_member_id = false;
    let r = c.join(req, 2, 1_000);
    let j = join_reply(&r, 2);
    assert_eq!(j.error, NONE);
    assert_eq!(j.protocol_name.as_deref(), Some("range"));
    assert_eq!(j.members.len(), 1);
    assert_eq!(&j.members[0].2[..], b"first");
}

/// OffsetCommit validation as Kafka's classic coordinator answers it: to a
/// group it does not hold, a generation is an older one
/// (ILLEGAL_GENERATION: the consumer rejoins), none with no member id is a
/// standalone consumer or an admin (accepted), a member id without a
/// generation is unknown; to a group with members, only its members at its
/// generation.
#[test]
fn offset_commit_validation_follows_kafka() {
    let h = H::new();
    assert_eq!(h.c.validate_commit("gone", "m-1", None, 7), ILLEGAL_GENERATION);
    assert_eq!(h.c.validate_commit("gone", "", None, -1), NONE);
    assert_eq!(h.c.validate_commit("gone", "m-1", None, -1), UNKNOWN_MEMBER_ID);
    let (h, id) = stable_one();
    assert_eq!(h.c.validate_commit("g", "", None, -1), UNKNOWN_MEMBER_ID);
    assert_eq!(h.c.validate_commit("g", "other", None, 1), UNKNOWN_MEMBER_ID);
    assert_eq!(h.c.validate_commit("g", &id, None, 99), ILLEGAL_GENERATION);
    let generation = h.c.describe("g").map_or(-1, |g| g.generation);
    assert_eq!(h.c.validate_commit("g", &id, None, generation), NONE);
}

/// `max_member_bytes`: members' metadata in many groups (names and metadata
/// come from clients) stop at the budget, counted exactly every second;
/// room comes back when members go.
#[test]
fn member_metadata_past_max_member_bytes_is_refused_until_members_go() {
    let mut c = GroupCoordinator::new(GroupConfig {
        max_member_bytes: 64 * 1024,
        initial_rebalance_delay_ms: 0,
        ..GroupConfig::default()
    });
    let meta = "x".repeat(10 * 1024);
    let mut joined = Vec::new();
    let mut refused = None;
    for i in 0..20u64 {
        let mut req = H::join_req("", &[("range", &meta)], None);
        req.group = format!("g{i}");
        req.require_known_member_id = false;
        let r = c.join(req, i + 1, 1_000);
        let j = join_reply(&r, i + 1);
        if j.error == NONE {
            joined.push((format!("g{i}"), j.member_id));
        } else {
            assert_eq!(j.error, COORDINATOR_NOT_AVAILABLE);
            refused = Some(i);
            break;
        }
    }
    assert_eq!(refused, Some(6), "64 KiB holds six members of 10 KiB");
    assert_eq!(c.refused_for_bytes(), 1);
    assert!(c.member_bytes() <= 64 * 1024);
    // The exact count agrees, and a rejoin with the same metadata takes no more.
    let _ = c.tick(2_500);
    let counted = c.member_bytes();
    assert!(counted > 6 * 10 * 1024 && counted <= 64 * 1024, "{counted}");
    let (g, id) = joined[0].clone();
    let mut again = H::join_req(&id, &[("range", &meta)], None);
    again.group = g.clone();
    let r = c.join(again, 100, 2_600);
    assert_eq!(join_reply(&r, 100).error, NONE);
    // Members leave: at the next count there is room again.
    for (g, id) in &joined {
        let _ = c.leave(g, &[(id.clone(), None)], 2_700);
    }
    let mut req = H::join_req("", &[("range", &meta)], None);
    req.group = "late".into();
    req.require_known_member_id = false;
    let r = c.join(req.clone(), 200, 2_800);
    assert_eq!(join_reply(&r, 200).error, COORDINATOR_NOT_AVAILABLE, "not counted yet");
    let _ = c.tick(3_600);
    assert!(c.member_bytes() < 1024, "{}", c.member_bytes());
    let r = c.join(req, 201, 3_700);
    assert_eq!(join_reply(&r, 201).error, NONE);
    // A first join told MEMBER_ID_REQUIRED keeps no metadata, and a join
    // answered with an error gives its bytes back.
    let before = c.member_bytes();
    let mut first = H::join_req("", &[("range", &meta)], None);
    first.group = "fresh".into();
    let r = c.join(first, 202, 3_800);
    assert_eq!(join_reply(&r, 202).error, MEMBER_ID_REQUIRED);
    let mut stranger = H::join_req("nobody", &[("range", &meta)], None);
    stranger.group = "absent".into();
    let r = c.join(stranger, 203, 3_800);
    assert_eq!(join_reply(&r, 203).error, UNKNOWN_MEMBER_ID);
    assert_eq!(c.member_bytes(), before);
}

/// LeaveGroup for a group the coordinator does not hold: each member is
/// UNKNOWN_MEMBER_ID under a top-level NONE, as Kafka answers v3+ (v0–2
/// fold the member's code into the top level).
#[test]
fn leaving_an_unknown_group_is_each_members_unknown_member_id() {
    let mut h = H::new();
    let (top, codes, replies) =
        h.c.leave("nowhere", &[("a".into(), None), ("b".into(), Some("i".into()))], h.now);
    assert_eq!(top, NONE);
    assert_eq!(codes, vec![UNKNOWN_MEMBER_ID, UNKNOWN_MEMBER_ID]);
    assert!(replies.is_empty());
}

/// A client that died between its two JoinGroups (MEMBER_ID_REQUIRED, then
/// nothing) does not hold the first generation of a new group: once the
/// initial delay is over the join completes with the members that joined,
/// as Kafka's tryCompleteInitialRebalanceElseSchedule (before: until the
/// pending id expired, a session timeout later).
#[test]
fn a_pending_member_id_does_not_hold_the_initial_rebalance() {
    let mut h = H::new();
    let (a, t, r) = h.new_member();
    assert!(r.is_empty(), "parked during the initial delay");
    // Another client's first join, never followed by its second.
    let (_, r) = h.join("");
    assert_eq!(join_reply(&r, h.next_token).error, MEMBER_ID_REQUIRED);
    // The delay is extended once (a member arrived during it), then ends.
    let r = h.advance(7_000);
    let j = join_reply(&r, t);
    assert_eq!((j.error, j.generation, j.leader.as_str()), (NONE, 1, a.as_str()));
    assert_eq!(j.members.len(), 1);
}
