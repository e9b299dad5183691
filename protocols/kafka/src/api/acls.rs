//! DescribeAcls, CreateAcls, DeleteAcls on the broker's one ACL table
//! (the one RocketMQ requests are checked against too). With authorization
//! off they answer SECURITY_DISABLED, as a Kafka broker without an
//! authorizer does.

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{DeleteAclsFilterResult, DeleteAclsMatchingAcl};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::*;
use rokka_broker::acl::{Acl, AclFilter, Operation, PatternType, Permission, ResourceType};
use rokka_broker::watermark::{CLUSTER_WAIT, NOT_IN_CLUSTER};

use super::str_bytes;
use crate::authz::{Caller, CLUSTER_AUTHORIZATION_FAILED, SECURITY_DISABLED};
use crate::errors::{INVALID_REQUEST, REQUEST_TIMED_OUT};
use crate::Kafka;

const DISABLED: &str = "no authorizer is configured on the broker (set [security] authorization = true)";

pub fn describe(k: &Kafka, who: &Caller, r: DescribeAclsRequest) -> DescribeAclsResponse {
    let fail = |code, m: &str| {
        DescribeAclsResponse::default()
            .with_error_code(code)
            .with_error_message(Some(str_bytes(m)))
    };
    if !k.broker.acls().enabled() {
        return fail(SECURITY_DISABLED, DISABLED);
    }
    if !who.may_cluster(k, Operation::Describe) {
        return fail(
            CLUSTER_AUTHORIZATION_FAILED,
            "DESCRIBE on the cluster is needed to list ACLs",
        );
    }
    let filter = match AclFilter::from_wire(
        r.resource_type_filter,
        r.resource_name_filter.as_ref().map(|s| s.as_str()),
        r.pattern_type_filter,
        r.principal_filter.as_ref().map(|s| s.as_str()),
        r.host_filter.as_ref().map(|s| s.as_str()),
        r.operation,
        r.permission_type,
    ) {
        Ok(f) => f,
        Err(e) => return fail(INVALID_REQUEST, &e),
    };
    // One entry per resource pattern, its ACLs under it (the table is
    // sorted by resource first).
    let mut resources: Vec<DescribeAclsResource> = Vec::new();
    for a in k.broker.acls().describe(&filter) {
        let d = AclDescription::default()
            .with_principal(str_bytes(&a.principal))
            .with_host(str_bytes(&a.host))
            .with_operation(a.operation.code())
            .with_permission_type(a.permission.code());
        match resources.last_mut() {
            Some(last)
                if last.resource_type == a.resource_type.code()
                    && last.resource_name.as_str() == a.name
                    && last.pattern_type == a.pattern.code() =>
            {
                last.acls.push(d)
            }
            _ => resources.push(
                DescribeAclsResource::default()
                    .with_resource_type(a.resource_type.code())
                    .with_resource_name(str_bytes(&a.name))
                    .with_pattern_type(a.pattern.code())
                    .with_acls(vec![d]),
            ),
        }
    }
    DescribeAclsResponse::default().with_resources(resources)
}

/// An ACL to create from its wire form; Err: why not.
fn acl_of(c: &create_acls_request::AclCreation) -> Result<Acl, String> {
    let resource_type =
        ResourceType::from_code(c.resource_type).ok_or_else(|| format!("invalid resource type {}", c.resource_type))?;
    let pattern = match c.resource_pattern_type {
        3 => PatternType::Literal,
        4 => PatternType::Prefixed,
        p => return Err(format!("invalid pattern type {p} (LITERAL or PREFIXED)")),
    };
    let operation = match Operation::from_code(c.operation) {
        Some(o) => o,
        None => return Err(format!("invalid operation {}", c.operation)),
    };
    let permission = match c.permission_type {
        2 => Permission::Deny,
        3 => Permission::Allow,
        p => return Err(format!("invalid permission type {p} (ALLOW or DENY)")),
    };
    Ok(Acl {
        resource_type,
        name: c.resource_name.to_string(),
        pattern,
        principal: c.principal.to_string(),
        host: c.host.to_string(),
        operation,
        permission,
    })
}

pub fn create(k: &Kafka, who: &Caller, r: CreateAclsRequest) -> CreateAclsResponse {
    let all = |code, m: &str| {
        let results = r
            .creations
            .iter()
            .map(|_| {
                AclCreationResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(m)))
            })
            .collect();
        CreateAclsResponse::default().with_results(results)
    };
    if !k.broker.acls().enabled() {
        return all(SECURITY_DISABLED, DISABLED);
    }
    if !who.may_cluster(k, Operation::Alter) {
        return all(
            CLUSTER_AUTHORIZATION_FAILED,
            "ALTER on the cluster is needed to create ACLs",
        );
    }
    // Malformed ones answered here; the others go to the table together
    // (one write).
    let mut parsed: Vec<Result<Acl, String>> = r.creations.iter().map(acl_of).collect();
    let valid: Vec<Acl> = parsed.iter().filter_map(|p| p.as_ref().ok().cloned()).collect();
    let mut done = rokka_broker::offload(|| k.broker.acls().create(valid)).into_iter();
    let results = parsed
        .iter_mut()
        .map(|p| {
            let r = match p {
                Ok(a) => {
                    let r = done.next().unwrap_or(Ok(()));
                    if r.is_ok() {
                        tracing::info!(principal = who.principal(), acl = ?a, "ACL created");
                    }
                    r.map_err(|e| (e.code, e.message))
                }
                Err(m) => Err((INVALID_REQUEST, std::mem::take(m))),
            };
            match r {
                Ok(()) => AclCreationResult::default(),
                Err((code, m)) => AclCreationResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(&m))),
            }
        })
        .collect();
    CreateAclsResponse::default().with_results(results)
}

pub fn delete(k: &Kafka, who: &Caller, r: DeleteAclsRequest) -> DeleteAclsResponse {
    let all = |code, m: &str| {
        let results = r
            .filters
            .iter()
            .map(|_| {
                DeleteAclsFilterResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(m)))
            })
            .collect();
        DeleteAclsResponse::default().with_filter_results(results)
    };
    if !k.broker.acls().enabled() {
        return all(SECURITY_DISABLED, DISABLED);
    }
    if !who.may_cluster(k, Operation::Alter) {
        return all(
            CLUSTER_AUTHORIZATION_FAILED,
            "ALTER on the cluster is needed to delete ACLs",
        );
    }
    let parsed: Vec<Result<AclFilter, String>> = r
        .filters
        .iter()
        .map(|f| {
            AclFilter::from_wire(
                f.resource_type_filter,
                f.resource_name_filter.as_ref().map(|s| s.as_str()),
                f.pattern_type_filter,
                f.principal_filter.as_ref().map(|s| s.as_str()),
                f.host_filter.as_ref().map(|s| s.as_str()),
                f.operation,
                f.permission_type,
            )
        })
        .collect();
    let valid: Vec<AclFilter> = parsed.iter().filter_map(|p| p.as_ref().ok().cloned()).collect();
    let deleted = match rokka_broker::offload(|| k.broker.acls().delete(&valid)) {
        Ok(d) => d,
        Err(e) => return all(crate::errors::UNKNOWN_SERVER_ERROR, &format!("ACLs not stored: {e}")),
    };
    let mut deleted = deleted.into_iter();
    let results = parsed
        .into_iter()
        .map(|p| match p {
            Err(m) => DeleteAclsFilterResult::default()
                .with_error_code(INVALID_REQUEST)
                .with_error_message(Some(str_bytes(&m))),
            Ok(_) => {
                let matching = deleted
                    .next()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|a| {
                        tracing::info!(principal = who.principal(), acl = ?a, "ACL deleted");
                        DeleteAclsMatchingAcl::default()
                            .with_resource_type(a.resource_type.code())
                            .with_resource_name(str_bytes(&a.name))
                            .with_pattern_type(a.pattern.code())
                            .with_principal(str_bytes(&a.principal))
                            .with_host(str_bytes(&a.host))
                            .with_operation(a.operation.code())
                            .with_permission_type(a.permission.code())
                    })
                    .collect();
                DeleteAclsFilterResult::default().with_matching_acls(matching)
            }
        })
        .collect();
    DeleteAclsResponse::default().with_filter_results(results)
}

/// Whether the cluster's table holds this node's changes so far (at once
/// on a single node); if not within CLUSTER_WAIT, the change is answered
/// REQUEST_TIMED_OUT (it stays queued and is written later).
async fn in_cluster(k: &Kafka) -> bool {
    let acls = k.broker.acls();
    acls.replicated(acls.last_change(), CLUSTER_WAIT).await
}

/// A CreateAcls answer, once every node can see what it created (as Kafka
/// answers after its metadata log commit).
pub async fn created_in_cluster(k: &Kafka, mut resp: CreateAclsResponse) -> CreateAclsResponse {
    if resp.results.iter().any(|r| r.error_code == 0) && !in_cluster(k).await {
        for r in resp.results.iter_mut().filter(|r| r.error_code == 0) {
            r.error_code = REQUEST_TIMED_OUT;
            r.error_message = Some(str_bytes(NOT_IN_CLUSTER));
        }
    }
    resp
}

/// A DeleteAcls answer, once every node can see what it deleted.
pub async fn deleted_in_cluster(k: &Kafka, mut resp: DeleteAclsResponse) -> DeleteAclsResponse {
    let deleted = |r: &DeleteAclsFilterResult| r.error_code == 0 && !r.matching_acls.is_empty();
    if resp.filter_results.iter().any(deleted) && !in_cluster(k).await {
        for r in resp.filter_results.iter_mut().filter(|r| deleted(r)) {
            r.error_code = REQUEST_TIMED_OUT;
            r.error_message = Some(str_bytes(NOT_IN_CLUSTER));
        }
    }
    resp
}
