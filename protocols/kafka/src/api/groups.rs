//! JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ListGroups, DescribeGroups,
//! DeleteGroups: request ↔ coordinator translation. Groups that only have
//! committed offsets (assign-mode consumers, RocketMQ groups) show as Empty.

use std::net::SocketAddr;

use bytes::Bytes;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rokka_group::{GroupState, JoinRequest, SyncRequest};

use super::str_bytes;
use crate::Kafka;

fn opt(s: &Option<StrBytes>) -> Option<String> {
    s.as_ref().map(|x| x.to_string())
}

pub async fn join(
    k: &Kafka,
    r: JoinGroupRequest,
    version: i16,
    client_id: &str,
    peer: SocketAddr,
) -> JoinGroupResponse {
    let session = r.session_timeout_ms.max(0) as u64;
    let req = JoinRequest {
        group: r.group_id.0.to_string(),
        member_id: r.member_id.to_string(),
        instance_id: opt(&r.group_instance_id),
        client_id: client_id.to_string(),
        client_host: format!("/{}", peer.ip()),
        session_timeout_ms: session,
        rebalance_timeout_ms: if version >= 1 {
            r.rebalance_timeout_ms.max(0) as u64
        } else {
            session
        },
        protocol_type: r.protocol_type.to_string(),
        protocols: r
            .protocols
            .into_iter()
            // Copied: the request's bytes are one buffer with the whole
            // frame, which a kept slice would keep whole.
            .map(|p| (p.name.to_string(), bytes::Bytes::copy_from_slice(&p.metadata)))
            .collect(),
        require_known_member_id: version >= 4,
        skip_assignment_supported: version >= 9,
    };
    let topics = req
        .protocols
        .first()
        .map(|(_, md)| crate::mixed::subscribed_topics(md))
        .unwrap_or_default();
    if req.protocol_type == "consumer" && crate::mixed::conflicts(k, &req.group, &topics) {
        return JoinGroupResponse::default()
            .with_error_code(crate::errors::INCONSISTENT_GROUP_PROTOCOL)
            .with_generation_id(-1)
            .with_member_id(str_bytes(&req.member_id));
    }
    let group = req.group.clone();
    let mut resp = k.groups.join(req).await;
    // A static member's new id taken without a rebalance is answered once
    // the set's in-sync replicas hold the group's record (Kafka writes it
    // first): a coordinator taking over would fence the member otherwise.
    // Not confirmed in time: retriable, the member joins again.
    if resp.durable && resp.error == crate::errors::NONE {
        if let Err(e) = k.broker.groups_durable(Some(k.groups.commit_timeout)).await {
            tracing::debug!(group, error = e, "static member's new id not replicated");
            resp = rokka_group::JoinResponse {
                error: match k.broker.cluster_view() {
                    Some(v) if !v.is_master() => super::not_coordinator::NOT_COORDINATOR,
                    _ => crate::errors::COORDINATOR_NOT_AVAILABLE,
                },
                generation: -1,
                ..rokka_group::JoinResponse::default()
            };
        }
    }
    let members = resp
        .members
        .into_iter()
        .map(|(id, inst, meta)| {
            JoinGroupResponseMember::default()
                .with_member_id(str_bytes(&id))
                .with_group_instance_id(if version >= 5 {
                    inst.map(|i| str_bytes(&i))
                } else {
                    None
                })
                .with_metadata(meta)
        })
        .collect();
    let mut out = JoinGroupResponse::default()
        .with_error_code(resp.error)
        .with_generation_id(resp.generation)
        .with_protocol_name(Some(str_bytes(&resp.protocol_name.unwrap_or_default())))
        .with_leader(str_bytes(&resp.leader))
        .with_member_id(str_bytes(&resp.member_id))
        .with_members(members);
    if version >= 7 {
        out.protocol_type = resp.protocol_type.map(|p| str_bytes(&p));
    }
    if version >= 9 {
        out.skip_assignment = resp.skip_assignment;
    }
    out
}

pub async fn sync(k: &Kafka, r: SyncGroupRequest, version: i16) -> SyncGroupResponse {
    let mut req = SyncRequest {
        group: r.group_id.0.to_string(),
        member_id: r.member_id.to_string(),
        instance_id: opt(&r.group_instance_id),
        generation: r.generation_id,
        protocol_type: opt(&r.protocol_type),
        protocol_name: opt(&r.protocol_name),
        assignments: r
            .assignments
            .into_iter()
            .map(|a| (a.member_id.to_string(), bytes::Bytes::copy_from_slice(&a.assignment)))
            .collect(),
    };
    // A mixed group's leader assignment is replaced by Rokka's (the share of
    // the queues the RocketMQ members leave to the Kafka members).
    if !req.assignments.is_empty() {
        if let Some(a) = crate::mixed::assignments(k, &req.group) {
            req.assignments = a;
        }
    }
    let group = req.group.clone();
    let mut resp = k.groups.sync(req).await;
    // The assignment is answered once the set's in-sync replicas hold the
    // group's record (Kafka answers SyncGroup after the group's record is
    // written to its offsets topic): a coordinator taking over after a
    // failover knows this generation. Not confirmed in time: retriable,
    // the member rejoins and is given its assignment again.
    if resp.error == crate::errors::NONE {
        if let Err(e) = k.broker.groups_durable(Some(k.groups.commit_timeout)).await {
            tracing::debug!(group, error = e, "group's rebalance not replicated");
            // Kafka's mapping of a failed group write: leadership lost is
            // NOT_COORDINATOR, anything else COORDINATOR_NOT_AVAILABLE.
            resp.error = match k.broker.cluster_view() {
                Some(v) if !v.is_master() => super::not_coordinator::NOT_COORDINATOR,
                _ => crate::errors::COORDINATOR_NOT_AVAILABLE,
            };
            resp.assignment = Default::default();
        }
    }
    let mut out = SyncGroupResponse::default()
        .with_error_code(resp.error)
        .with_assignment(resp.assignment);
    if version >= 5 {
        out.protocol_type = resp.protocol_type.map(|p| str_bytes(&p));
        out.protocol_name = resp.protocol_name.map(|p| str_bytes(&p));
    }
    out
}

pub fn heartbeat(k: &Kafka, r: HeartbeatRequest) -> HeartbeatResponse {
    let code = k.groups.heartbeat(
        r.group_id.0.as_str(),
        r.member_id.as_str(),
        r.group_instance_id.as_ref().map(|s| s.as_str()),
        r.generation_id,
    );
    HeartbeatResponse::default().with_error_code(code)
}

pub fn leave(k: &Kafka, r: LeaveGroupRequest, version: i16) -> LeaveGroupResponse {
    let group = r.group_id.0.to_string();
    if version < 3 {
        let (code, codes) = k.groups.leave(&group, &[(r.member_id.to_string(), None)]);
        let c = if code != 0 {
            code
        } else {
            codes.first().copied().unwrap_or(0)
        };
        return LeaveGroupResponse::default().with_error_code(c);
    }
    let members: Vec<(String, Option<String>)> = r
        .members
        .iter()
        .map(|m| (m.member_id.to_string(), opt(&m.group_instance_id)))
        .collect();
    let (code, codes) = k.groups.leave(&group, &members);
    let responses = r
        .members
        .into_iter()
        .zip(codes)
        .map(|(m, c)| {
            MemberResponse::default()
                .with_member_id(m.member_id)
                .with_group_instance_id(m.group_instance_id)
                .with_error_code(c)
        })
        .collect();
    LeaveGroupResponse::default()
        .with_error_code(code)
        .with_members(responses)
}

/// Every group: the coordinator's, plus groups known only by their offsets.
/// (name, state, protocol type, group type) of every group: classic and
/// KIP-848 consumer groups, and groups known only by committed offsets.
fn all_groups(k: &Kafka) -> Vec<(String, String, String, &'static str)> {
    let mut out: Vec<(String, String, String, &'static str)> = k.groups.with(|c| {
        let mut v: Vec<_> = c
            .list()
            .into_iter()
            .map(|(n, s, p)| (n, s.name().to_string(), p, "classic"))
            .collect();
        v.extend(c.consumer.groups.values().map(|g| {
            (
                g.name.clone(),
                g.state().to_string(),
                "consumer".to_string(),
                "consumer",
            )
        }));
        v
    });
    let live: std::collections::HashSet<String> = out.iter().map(|(n, _, _, _)| n.clone()).collect();
    for g in k.broker.store().offsets().groups() {
        // The delay levels' and the transaction check's progress is the
        // broker's, not a group (and no client may move or delete it).
        if rokka_broker::is_system_group(&g) {
            continue;
        }
        if !live.contains(&g) {
            out.push((g, "Empty".into(), "consumer".into(), "classic"));
        }
    }
    // Groups with live RocketMQ clients are Stable, as DescribeGroups shows
    // them (their clients as members), and listed even before they commit.
    let rocketmq = k.broker.membership().rocketmq_groups(rokka_store::now_ms());
    for (name, state, ptype, _) in out.iter_mut() {
        if state == "Empty" && rocketmq.contains(name) {
            *state = "Stable".into();
            *ptype = "consumer".into();
        }
    }
    let listed: std::collections::HashSet<String> = out.iter().map(|(n, _, _, _)| n.clone()).collect();
    for g in rocketmq {
        if !listed.contains(&g) {
            out.push((g, "Stable".into(), "consumer".into(), "classic"));
        }
    }
    out.sort();
    out
}

pub fn list(k: &Kafka, r: ListGroupsRequest, version: i16) -> ListGroupsResponse {
    let groups = all_groups(k)
        .into_iter()
        .filter(|(_, state, _, _)| {
            r.states_filter.is_empty() || r.states_filter.iter().any(|f| f.as_str().eq_ignore_ascii_case(state))
        })
        .filter(|(_, _, _, kind)| {
            r.types_filter.is_empty() || r.types_filter.iter().any(|f| f.as_str().eq_ignore_ascii_case(kind))
        })
        .map(|(name, state, ptype, kind)| {
            let mut g = ListedGroup::default()
                .with_group_id(GroupId(str_bytes(&name)))
                .with_protocol_type(str_bytes(&ptype));
            if version >= 4 {
                g = g.with_group_state(str_bytes(&state));
            }
            if version >= 5 {
                g = g.with_group_type(str_bytes(kind));
            }
            g
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}

pub fn describe(k: &Kafka, r: DescribeGroupsRequest, version: i16) -> DescribeGroupsResponse {
    // A group named twice is described once: a small request must not make
    // a response of every member's metadata once per repeat.
    let mut seen = std::collections::HashSet::with_capacity(r.groups.len().min(1024));
    let groups = r
        .groups
        .into_iter()
        .filter(|gid| seen.insert(gid.clone()))
        .map(|gid| {
            let name = gid.0.to_string();
            let (view, consumer) = k
                .groups
                .with(|c| (c.describe(&name), c.consumer.groups.contains_key(&name)));
            let mut d = DescribedGroup::default().with_group_id(gid);
            if consumer {
                // A KIP-848 group is described by ConsumerGroupDescribe:
                // here Dead, and from v6 on GROUP_ID_NOT_FOUND (KIP-1043);
                // before v6 without an error, as Kafka answers them — the
                // older clients throw for the whole call on any group's
                // error (kafkajs' DescribeGroups v0-2 parse).
                d.group_state = str_bytes("Dead");
                if version >= 6 {
                    d.error_code = rokka_group::code::GROUP_ID_NOT_FOUND;
                    d.error_message = Some(str_bytes(&format!("Group {name} is not a classic group.")));
                }
                // RocketMQ clients of the group (it may be theirs again once
                // its Kafka members left) are listed all the same, for the
                // admin tools (Kafka clients ignore members of an error
                // answer).
                describe_rocketmq_members(k, &name, &mut d);
                return d;
            }
            match view {
                Some(v) => {
                    d.group_state = str_bytes(v.state.name());
                    d.protocol_type = str_bytes(&v.protocol_type);
                    d.protocol_data = str_bytes(&v.protocol);
                    d.members = v
                        .members
                        .into_iter()
                        .map(|m| {
                            DescribedGroupMember::default()
                                .with_member_id(str_bytes(&m.member_id))
                                .with_group_instance_id(if version >= 4 {
                                    m.instance_id.map(|i| str_bytes(&i))
                                } else {
                                    None
                                })
                                .with_client_id(str_bytes(&m.client_id))
                                .with_client_host(str_bytes(&m.client_host))
                                // Outside Stable neither (Kafka's
                                // summaryNoMetadata): a rebalance is
                                // replacing the assignment.
                                .with_member_metadata(if v.state == GroupState::Stable {
                                    m.metadata
                                } else {
                                    Bytes::new()
                                })
                                .with_member_assignment(if v.state == GroupState::Stable {
                                    m.assignment
                                } else {
                                    Bytes::new()
                                })
                        })
                        .collect();
                }
                None if k.broker.store().offsets().group_offsets(&name).is_empty() => {
                    d.group_state = str_bytes("Dead");
                }
                None => {
                    d.group_state = str_bytes("Empty");
                    d.protocol_type = str_bytes("consumer");
                }
            }
            describe_rocketmq_members(k, &name, &mut d);
            d
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

/// A group's RocketMQ clients as members (client id as member id, their
/// topics as subscription, their averaging share as assignment); a group with
/// only RocketMQ members shows as Stable with protocol `rocketmq-averagely`.
fn describe_rocketmq_members(k: &Kafka, name: &str, d: &mut DescribedGroup) {
    describe_pop_consumers(k, name, d);
    let m = k.broker.membership().get(name);
    if m.rocketmq.is_empty() {
        return;
    }
    let mut ids: std::collections::BTreeSet<String> = m.rocketmq.clone();
    ids.extend(d.members.iter().map(|x| x.member_id.to_string()));
    let ids: Vec<String> = ids.into_iter().collect();
    if d.members.is_empty() {
        d.group_state = str_bytes("Stable");
        d.protocol_type = str_bytes("consumer");
        d.protocol_data = str_bytes("rocketmq-averagely");
    }
    for id in &m.rocketmq {
        d.members.push(
            DescribedGroupMember::default()
                .with_member_id(str_bytes(id))
                .with_client_id(str_bytes(id))
                .with_client_host(str_bytes(id.split('@').next().unwrap_or_default()))
                .with_member_metadata(crate::mixed::encode_subscription(&m.rocketmq_topics))
                .with_member_assignment(crate::mixed::share(k, &m.rocketmq_topics, &ids, id)),
        );
    }
}

/// A group's RocketMQ 5 pop consumers (gRPC) as members: client id as
/// member id, no assignment (a pop takes from any queue); a group with only
/// them shows as Stable with protocol `rocketmq-pop` (they never share a
/// group with queue owners).
fn describe_pop_consumers(k: &Kafka, name: &str, d: &mut DescribedGroup) {
    let ids = k.broker.membership().pop_consumers(name, rokka_store::now_ms());
    if ids.is_empty() {
        return;
    }
    if d.members.is_empty() {
        d.group_state = str_bytes("Stable");
        d.protocol_type = str_bytes("consumer");
        d.protocol_data = str_bytes("rocketmq-pop");
    }
    for id in ids {
        d.members.push(
            DescribedGroupMember::default()
                .with_member_id(str_bytes(&id))
                .with_client_id(str_bytes(&id))
                .with_client_host(str_bytes(id.split('@').next().unwrap_or_default())),
        );
    }
}

/// Live members of `group` the Kafka coordinator does not hold: RocketMQ
/// remoting consumers (with the topics they subscribe) and RocketMQ 5 pop
/// consumers. DescribeGroups shows them; DeleteGroups, OffsetDelete and an
/// admin's offset commit treat the group as in use while they are there.
pub(crate) struct OtherMembers {
    pub live: bool,
    /// Topics they consume; None: unknown (pop consumers), so every topic.
    pub topics: Option<std::collections::BTreeSet<String>>,
}

pub(crate) fn other_members(k: &Kafka, group: &str) -> OtherMembers {
    let m = k.broker.membership();
    let remoting = m.get(group);
    let pop = !m.pop_consumers(group, rokka_store::now_ms()).is_empty();
    OtherMembers {
        live: pop || !remoting.rocketmq.is_empty(),
        topics: (!pop).then_some(remoting.rocketmq_topics),
    }
}

/// `drops_configs`: whether the caller may also take away a group's kept
/// RocketMQ subscription-group config (ALTER on the cluster, what setting
/// one takes). Without it a group's offsets and membership go, as Kafka's
/// DeleteGroups defines, and an operator's config stays; a group that is
/// nothing but such a config is answered GROUP_AUTHORIZATION_FAILED.
pub async fn delete(k: &Kafka, r: DeleteGroupsRequest, drops_configs: bool) -> DeleteGroupsResponse {
    let mut results = Vec::with_capacity(r.groups_names.len());
    // Results of groups whose subscription-group config was removed here.
    let mut removed = Vec::new();
    for gid in r.groups_names {
        let name = gid.0.to_string();
        let offsets = k.broker.store().offsets();
        let has = !offsets.group_offsets(&name).is_empty();
        // Kafka's validateDeleteGroup: NON_EMPTY_GROUP while it has
        // members — RocketMQ ones count (their progress is these offsets).
        let (held, busy) = k.groups.with(|c| {
            let consumer = c.consumer.groups.get(&name);
            (
                c.state(&name).is_some() || consumer.is_some(),
                consumer.is_some_and(|g| !g.members.is_empty())
                    || c.state(&name)
                        .is_some_and(|s| !matches!(s, GroupState::Empty | GroupState::Dead)),
            )
        });
        let mut code = if rokka_broker::is_system_group(&name) {
            // The broker's own progress (id_len.rs).
            crate::errors::INVALID_GROUP_ID
        } else if busy || other_members(k, &name).live {
            rokka_group::code::NON_EMPTY_GROUP
        } else {
            rokka_group::code::NONE
        };
        if code == 0 {
            // Several broker sets: the group's offsets of other sets'
            // partitions live on their masters (Kafka keeps a group's
            // offsets in one place and deletes them together). Those
            // first: a set not reached leaves the group as it was here.
            let mut found = has || held;
            match delete_on_other_sets(k, &name).await {
                Ok(n) => found |= n > 0,
                Err(e) => {
                    tracing::warn!(
                        group = name,
                        error = e,
                        "deleting a group's offsets on another broker set failed"
                    );
                    code = rokka_group::code::COORDINATOR_NOT_AVAILABLE;
                }
            }
            if code == 0 {
                // (A member that joined meanwhile: NON_EMPTY_GROUP.)
                code = k.groups.with(|c| c.delete(&name, true));
            }
            if code == 0 {
                offsets.delete_group(&name);
                // Its RocketMQ subscription-group config too: one set of
                // groups (written and fsynced: off the async workers; in
                // cluster mode answered once etcd holds the deletions,
                // waited for once after every group).
                // Without ALTER on the cluster nothing is asked of the
                // config at all (in cluster mode a removal here would also
                // take away one set on another node this node has not
                // seen yet).
                let kept = !drops_configs && k.broker.sub_groups().contains(&name);
                if kept {
                    tracing::info!(
                        group = name,
                        "a deleted group's subscription-group config stays: the caller may not alter the cluster"
                    );
                }
                let went = if drops_configs {
                    rokka_broker::offload(|| k.broker.sub_groups().remove(&name))
                } else {
                    Ok(false)
                };
                match went {
                    Ok(had) => {
                        found |= had;
                        if had {
                            removed.push(results.len());
                        }
                    }
                    // (Refused with no config here — cluster mode, etcd
                    // behind — the group's own deletion stands.)
                    Err(r) if !k.broker.sub_groups().contains(&name) => {
                        tracing::debug!(
                            group = name,
                            error = r.0,
                            "no config deletion queued for a deleted group"
                        );
                    }
                    Err(r) => {
                        tracing::warn!(
                            group = name,
                            error = r.0,
                            "a deleted group's subscription-group config stays"
                        );
                        code = rokka_group::code::COORDINATOR_NOT_AVAILABLE;
                    }
                }
                if code == 0 && !found {
                    code = if kept {
                        // Nothing but a config the caller may not drop.
                        super::guard::GROUP_DENIED
                    } else {
                        // Neither held here nor committed anywhere.
                        rokka_group::code::GROUP_ID_NOT_FOUND
                    };
                }
            }
        }
        results.push(DeletableGroupResult::default().with_group_id(gid).with_error_code(code));
    }
    // Cluster mode: the groups whose config went are answered once etcd
    // holds the deletions (else a restart would bring the config back):
    // COORDINATOR_NOT_AVAILABLE (retriable) when it does not in time.
    let changes = k.broker.sub_groups().changes();
    if !removed.is_empty()
        && !changes
            .replicated(changes.last_change(), rokka_broker::watermark::CLUSTER_WAIT)
            .await
    {
        tracing::warn!("deleted groups' subscription-group configs: etcd does not hold the deletions yet (retried)");
        for i in removed {
            results[i].error_code = rokka_group::code::COORDINATOR_NOT_AVAILABLE;
        }
    }
    DeleteGroupsResponse::default().with_results(results)
}

/// Deletes `group`'s offsets on every other broker set's master; how many
/// went (0 with one set).
async fn delete_on_other_sets(k: &Kafka, group: &str) -> Result<u64, String> {
    let others = super::offsets::other_sets(k);
    let mut n = 0;
    for set in others {
        let fw = k.broker.remote_offsets().ok_or("no route to other broker sets")?;
        n += fw.delete_group(&set, group).await?;
    }
    Ok(n)
}
