//! In-process authorization checks with our own codec (in addition to
//! confluent-kafka, kafka-python and rocketmq-client-rust in
//! compat-tests/cross/test_acls.py): the APIs real clients there do not
//! reach — CreateTopics, DeleteTopics, DescribeConfigs, OffsetFetch v8 of
//! several groups, DeleteGroups, InitProducerId, a Produce naming an
//! allowed and a refused topic, the ACL APIs themselves — answer each
//! refused part with its authorization error and serve the rest.

use std::sync::Arc;

use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rokka_broker::acl::{Acl, AclSettings, Operation, PatternType, Permission, ResourceType};
use rokka_broker::{Broker, BrokerConfig};
use rokka_store::{MessageStore, StoreConfig};
use tokio::net::TcpStream;

mod common;
use common::call;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TOPIC_DENIED: i16 = 29;
const GROUP_DENIED: i16 = 30;
const CLUSTER_DENIED: i16 = 31;
const TXN_DENIED: i16 = 53;

fn allow(rt: ResourceType, name: &str, pattern: PatternType, op: Operation) -> Acl {
    Acl {
        resource_type: rt,
        name: name.into(),
        pattern,
        principal: "User:ANONYMOUS".into(),
        host: "*".into(),
        operation: op,
        permission: Permission::Allow,
    }
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

#[tokio::test]
async fn refused_parts_get_their_error_and_the_rest_is_served() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
    let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
    broker.acls().configure(AclSettings {
        enabled: true,
        max_acls: 100,
        ..AclSettings::default()
    });
    let made = broker.acls().create(vec![
        allow(ResourceType::Topic, "ok-", PatternType::Prefixed, Operation::All),
        allow(ResourceType::Group, "g-ok", PatternType::Literal, Operation::Read),
    ]);
    assert!(made.iter().all(|r| r.is_ok()), "{made:?}");
    // A topic the caller may not touch, made behind the ACLs' back.
    broker.create_topic("secret", 1)?;
    let (addr, _stop) = common::serve(broker).await?;
    let mut c = TcpStream::connect(addr).await?;

    // CreateTopics: CREATE on ok-* only.
    let r: CreateTopicsResponse = call(
        &mut c,
        ApiKey::CreateTopics,
        5,
        &CreateTopicsRequest::default().with_timeout_ms(5000).with_topics(vec![
            create_topics_request::CreatableTopic::default()
                .with_name(TopicName(s("ok-1")))
                .with_num_partitions(1)
                .with_replication_factor(1),
            create_topics_request::CreatableTopic::default()
                .with_name(TopicName(s("nope")))
                .with_num_partitions(1)
                .with_replication_factor(1),
        ]),
    )
    .await?;
    let codes: Vec<(String, i16)> = r.topics.iter().map(|t| (t.name.0.to_string(), t.error_code)).collect();
    assert!(codes.contains(&("ok-1".into(), 0)), "{codes:?}");
    assert!(codes.contains(&("nope".into(), TOPIC_DENIED)), "{codes:?}");

    // Metadata of all topics lists only what may be described; one asked
    // for by name is refused.
    let m: MetadataResponse = call(
        &mut c,
        ApiKey::Metadata,
        9,
        &MetadataRequest::default().with_topics(None),
    )
    .await?;
    let names: Vec<String> = m
        .topics
        .iter()
        .filter_map(|t| t.name.as_ref())
        .map(|n| n.0.to_string())
        .collect();
    assert_eq!(names, vec!["ok-1".to_string()]);
    let m: MetadataResponse = call(
        &mut c,
        ApiKey::Metadata,
        9,
        &MetadataRequest::default().with_topics(Some(vec![
            metadata_request::MetadataRequestTopic::default().with_name(Some(TopicName(s("secret"))))
        ])),
    )
    .await?;
    assert_eq!(m.topics[0].error_code, TOPIC_DENIED);

    // DescribeTopicPartitions (the Java Admin's describeTopics): a topic
    // named but not describable is answered TOPIC_AUTHORIZATION_FAILED,
    // not left out (the Admin asked again until its timeout); listing all
    // leaves it out.
    // Both names, a page of `limit` partitions, from `cursor` on.
    let named = |limit: i32, cursor: Option<&str>| {
        DescribeTopicPartitionsRequest::default()
            .with_topics(vec![
                describe_topic_partitions_request::TopicRequest::default().with_name(TopicName(s("secret"))),
                describe_topic_partitions_request::TopicRequest::default().with_name(TopicName(s("ok-1"))),
            ])
            .with_cursor(
                cursor.map(|t| describe_topic_partitions_request::Cursor::default().with_topic_name(TopicName(s(t)))),
            )
            .with_response_partition_limit(limit)
    };
    let d: DescribeTopicPartitionsResponse =
        call(&mut c, ApiKey::DescribeTopicPartitions, 0, &named(100, None)).await?;
    let got: Vec<(String, i16, usize)> = d
        .topics
        .iter()
        .map(|t| {
            (
                t.name.as_ref().map_or(String::new(), |n| n.0.to_string()),
                t.error_code,
                t.partitions.len(),
            )
        })
        .collect();
    assert!(got.contains(&("secret".into(), TOPIC_DENIED, 0)), "{got:?}");
    assert!(got.contains(&("ok-1".into(), 0, 1)), "{got:?}");
    // A page filled before it: no cursor names the refused topic (its
    // existence and partition count were told, and the Admin walked it).
    let paged: DescribeTopicPartitionsResponse =
        call(&mut c, ApiKey::DescribeTopicPartitions, 0, &named(1, None)).await?;
    assert!(paged.next_cursor.is_none(), "{:?}", paged.next_cursor);
    assert_eq!(paged.topics.len(), 2, "{:?}", paged.topics);
    // A later page (its cursor past both names) answers neither again.
    let later: DescribeTopicPartitionsResponse =
        call(&mut c, ApiKey::DescribeTopicPartitions, 0, &named(1, Some("t"))).await?;
    assert!(later.topics.is_empty(), "{:?}", later.topics);
    let all: DescribeTopicPartitionsResponse = call(
        &mut c,
        ApiKey::DescribeTopicPartitions,
        0,
        &DescribeTopicPartitionsRequest::default().with_response_partition_limit(100),
    )
    .await?;
    assert!(all
        .topics
        .iter()
        .all(|t| t.name.as_ref().is_none_or(|n| n.0.as_str() != "secret")));

    // Produce to an allowed and a refused topic: one stored, one refused.
    let batch = bytes::Bytes::from(rokka_store::record::kafka::build_test_batch(&[b"v"], 1_000));
    let td = |name: &str| {
        TopicProduceData::default()
            .with_name(TopicName(s(name)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(batch.clone()))])
    };
    let p: ProduceResponse = call(
        &mut c,
        ApiKey::Produce,
        9,
        &ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(5000)
            .with_topic_data(vec![td("ok-1"), td("secret")]),
    )
    .await?;
    let codes: Vec<(String, i16)> = p
        .responses
        .iter()
        .map(|t| (t.name.0.to_string(), t.partition_responses[0].error_code))
        .collect();
    assert!(
        codes.contains(&("ok-1".into(), 0)) && codes.contains(&("secret".into(), TOPIC_DENIED)),
        "{codes:?}"
    );

    // A transactional batch without a transactional id, to a topic the
    // caller may write: refused as Kafka refuses it (its records would join
    // whichever producer's transaction its producer id names).
    let mut txn_batch = rokka_store::record::kafka::build_test_batch(&[b"v"], 1_000);
    txn_batch[22] |= 0x10;
    let p: ProduceResponse = call(
        &mut c,
        ApiKey::Produce,
        9,
        &ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(5000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(s("ok-1")))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(bytes::Bytes::from(txn_batch)))])]),
    )
    .await?;
    assert_eq!(p.responses[0].partition_responses[0].error_code, TXN_DENIED);

    // DeleteTopics and DescribeConfigs (a topic, and the broker: cluster).
    let d: DeleteTopicsResponse = call(
        &mut c,
        ApiKey::DeleteTopics,
        4,
        &DeleteTopicsRequest::default()
            .with_timeout_ms(5000)
            .with_topic_names(vec![TopicName(s("secret"))]),
    )
    .await?;
    assert_eq!(d.responses[0].error_code, TOPIC_DENIED);
    let dc: DescribeConfigsResponse = call(
        &mut c,
        ApiKey::DescribeConfigs,
        4,
        &DescribeConfigsRequest::default().with_resources(vec![
            describe_configs_request::DescribeConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(s("secret")),
            describe_configs_request::DescribeConfigsResource::default()
                .with_resource_type(4)
                .with_resource_name(s("0")),
            describe_configs_request::DescribeConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(s("ok-1")),
        ]),
    )
    .await?;
    let codes: Vec<(String, i16)> = dc
        .results
        .iter()
        .map(|r| (r.resource_name.to_string(), r.error_code))
        .collect();
    assert!(codes.contains(&("secret".into(), TOPIC_DENIED)), "{codes:?}");
    assert!(codes.contains(&("0".into(), CLUSTER_DENIED)), "{codes:?}");
    assert!(codes.contains(&("ok-1".into(), 0)), "{codes:?}");

    // OffsetFetch v8 of two groups: the one it may not describe refused.
    let of: OffsetFetchResponse = call(
        &mut c,
        ApiKey::OffsetFetch,
        8,
        &OffsetFetchRequest::default().with_groups(vec![
            offset_fetch_request::OffsetFetchRequestGroup::default().with_group_id(GroupId(s("g-ok"))),
            offset_fetch_request::OffsetFetchRequestGroup::default().with_group_id(GroupId(s("g-other"))),
        ]),
    )
    .await?;
    let codes: Vec<(String, i16)> = of
        .groups
        .iter()
        .map(|g| (g.group_id.0.to_string(), g.error_code))
        .collect();
    assert!(
        codes.contains(&("g-ok".into(), 0)) && codes.contains(&("g-other".into(), GROUP_DENIED)),
        "{codes:?}"
    );
    let dg: DeleteGroupsResponse = call(
        &mut c,
        ApiKey::DeleteGroups,
        2,
        &DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s("g-ok"))]),
    )
    .await?;
    assert_eq!(dg.results[0].error_code, GROUP_DENIED, "READ is not DELETE");

    // Transactional InitProducerId: WRITE on the id needed; an idempotent
    // one passes (WRITE on some topic, via ALL on ok-*).
    let ip: InitProducerIdResponse = call(
        &mut c,
        ApiKey::InitProducerId,
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(s("tx-1"))))
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    )
    .await?;
    assert_eq!(ip.error_code, TXN_DENIED);
    let ip: InitProducerIdResponse = call(
        &mut c,
        ApiKey::InitProducerId,
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    )
    .await?;
    assert_eq!(ip.error_code, 0);

    // The ACL APIs need the cluster's DESCRIBE / ALTER.
    let da: DescribeAclsResponse = call(
        &mut c,
        ApiKey::DescribeAcls,
        2,
        &DescribeAclsRequest::default()
            .with_resource_type_filter(1)
            .with_pattern_type_filter(1)
            .with_operation(1)
            .with_permission_type(1),
    )
    .await?;
    assert_eq!(da.error_code, CLUSTER_DENIED);
    let ca: CreateAclsResponse = call(
        &mut c,
        ApiKey::CreateAcls,
        2,
        &CreateAclsRequest::default().with_creations(vec![create_acls_request::AclCreation::default()
            .with_resource_type(2)
            .with_resource_name(s("secret"))
            .with_resource_pattern_type(3)
            .with_principal(s("User:ANONYMOUS"))
            .with_host(s("*"))
            .with_operation(2)
            .with_permission_type(3)]),
    )
    .await?;
    assert_eq!(ca.results[0].error_code, CLUSTER_DENIED);
    Ok(())
}

/// DescribeTransactions of an id the caller may describe lists only the
/// topics it may describe (KafkaApis filters them so): a transaction's
/// partitions of another principal's topics are not shown.
#[tokio::test]
async fn a_described_transaction_lists_only_the_topics_the_caller_may_describe() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
    let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
    broker.create_topic("ok-1", 1)?;
    broker.create_topic("secret", 1)?;
    let id = broker
        .txn_init_producer_id("tx", 60_000, None)
        .await
        .map_err(|c| format!("init: {c}"))?;
    let parts = [
        ("ok-1".to_string(), rokka_broker::Placed::Here(0)),
        ("secret".to_string(), rokka_broker::Placed::Here(0)),
    ];
    broker
        .txn_add_partitions("tx", id.producer_id, id.epoch, &parts)
        .await
        .map_err(|c| format!("add: {c}"))?;
    broker.acls().configure(AclSettings {
        enabled: true,
        max_acls: 100,
        ..AclSettings::default()
    });
    let made = broker.acls().create(vec![
        allow(ResourceType::Topic, "ok-", PatternType::Prefixed, Operation::Describe),
        allow(
            ResourceType::TransactionalId,
            "tx",
            PatternType::Literal,
            Operation::Describe,
        ),
    ]);
    assert!(made.iter().all(|r| r.is_ok()), "{made:?}");
    let (addr, _stop) = common::serve(broker).await?;
    let mut c = TcpStream::connect(addr).await?;
    let r: DescribeTransactionsResponse = call(
        &mut c,
        ApiKey::DescribeTransactions,
        0,
        &DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(s("tx"))]),
    )
    .await?;
    let st = &r.transaction_states[0];
    assert_eq!(st.error_code, 0);
    let topics: Vec<String> = st.topics.iter().map(|t| t.topic.0.to_string()).collect();
    assert_eq!(topics, vec!["ok-1".to_string()]);
    Ok(())
}
