//! In-process tests with our own codec (in addition to the real clients in
//! compat-tests/kafka): idempotent-producer sequence checks, bad input.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rokka_broker::{Broker, BrokerConfig};
use rokka_store::{MessageStore, StoreConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::{call, closed};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn start(
    dir: &std::path::Path,
) -> Result<(std::net::SocketAddr, tokio::sync::watch::Sender<bool>), Box<dyn std::error::Error>> {
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir))?);
    let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
    common::serve(broker).await
}

fn batch(producer_id: i64, epoch: i16, base_seq: i32, values: &[&[u8]]) -> Bytes {
    let mut b = rokka_store::record::kafka::build_test_batch(values, 1_000);
    b[43..51].copy_from_slice(&producer_id.to_be_bytes());
    b[51..53].copy_from_slice(&epoch.to_be_bytes());
    b[53..57].copy_from_slice(&base_seq.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(b)
}

fn produce_req(topic: &str, records: Bytes) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.into())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])])
}

fn partition(resp: &ProduceResponse) -> (i16, i64) {
    let p = &resp.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

#[tokio::test]
async fn idempotent_producer_duplicates_and_gaps() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut s = TcpStream::connect(addr).await?;
    let _: MetadataResponse = call(
        &mut s,
        ApiKey::Metadata,
        9,
        &MetadataRequest::default()
            .with_topics(Some(vec![
                kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_static_str("idem")))),
            ]))
            .with_allow_auto_topic_creation(true),
    )
    .await?;
    let init: InitProducerIdResponse = call(
        &mut s,
        ApiKey::InitProducerId,
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60000),
    )
    .await?;
    assert_eq!(init.error_code, 0);
    let pid = init.producer_id.0;
    let r: ProduceResponse = call(
        &mut s,
        ApiKey::Produce,
        9,
        &produce_req("idem", batch(pid, 0, 0, &[b"a", b"b"])),
    )
    .await?;
    assert_eq!(partition(&r), (0, 0));
    let r: ProduceResponse = call(
        &mut s,
        ApiKey::Produce,
        9,
        &produce_req("idem", batch(pid, 0, 2, &[b"c"])),
    )
    .await?;
    assert_eq!(partition(&r), (0, 2));
    // A retry of the first batch: acknowledged with its offset, not appended.
    let r: ProduceResponse = call(
        &mut s,
        ApiKey::Produce,
        9,
        &produce_req("idem", batch(pid, 0, 0, &[b"a", b"b"])),
    )
    .await?;
    assert_eq!(partition(&r), (0, 0));
    // A gap in sequences.
    let r: ProduceResponse = call(
        &mut s,
        ApiKey::Produce,
        9,
        &produce_req("idem", batch(pid, 0, 9, &[b"z"])),
    )
    .await?;
    assert_eq!(partition(&r).0, rokka_kafka::errors::OUT_OF_ORDER_SEQUENCE_NUMBER);
    // A new epoch starts again at 0; the old epoch is fenced.
    let r: ProduceResponse = call(
        &mut s,
        ApiKey::Produce,
        9,
        &produce_req("idem", batch(pid, 1, 0, &[b"d"])),
    )
    .await?;
    assert_eq!(partition(&r), (0, 3));
    let r: ProduceResponse = call(
        &mut s,
        ApiKey::Produce,
        9,
        &produce_req("idem", batch(pid, 0, 3, &[b"e"])),
    )
    .await?;
    assert_eq!(partition(&r).0, rokka_kafka::errors::INVALID_PRODUCER_EPOCH);
    // Exactly 4 records were stored.
    let lo: ListOffsetsResponse = call(
        &mut s,
        ApiKey::ListOffsets,
        7,
        &ListOffsetsRequest::default().with_topics(vec![
            kafka_protocol::messages::list_offsets_request::ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("idem")))
                .with_partitions(vec![
                    kafka_protocol::messages::list_offsets_request::ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_timestamp(-1),
                ]),
        ]),
    )
    .await?;
    assert_eq!(lo.topics[0].partitions[0].offset, 4);
    Ok(())
}

#[tokio::test]
async fn corrupt_batches_are_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut s = TcpStream::connect(addr).await?;
    let _: CreateTopicsResponse = call(
        &mut s,
        ApiKey::CreateTopics,
        5,
        &CreateTopicsRequest::default().with_topics(vec![
            kafka_protocol::messages::create_topics_request::CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("c")))
                .with_num_partitions(1)
                .with_replication_factor(1),
        ]),
    )
    .await?;
    let mut bad = batch(-1, -1, -1, &[b"x"]).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let r: ProduceResponse = call(&mut s, ApiKey::Produce, 9, &produce_req("c", Bytes::from(bad))).await?;
    assert_eq!(partition(&r).0, rokka_kafka::errors::CORRUPT_MESSAGE);
    let r: ProduceResponse = call(
        &mut s,
        ApiKey::Produce,
        9,
        &produce_req("c", Bytes::from_static(b"garbage")),
    )
    .await?;
    assert_eq!(partition(&r).0, rokka_kafka::errors::CORRUPT_MESSAGE);
    let r: ProduceResponse = call(
        &mut s,
        ApiKey::Produce,
        9,
        &produce_req("nope", batch(-1, -1, -1, &[b"x"])),
    )
    .await?;
    assert_eq!(partition(&r).0, rokka_kafka::errors::UNKNOWN_TOPIC_OR_PARTITION);

    // Valid CRCs over lies: a record count of 0x7FFFFFF0 (this batch, once
    // stored, aborted every RocketMQ pull of its queue), a count that
    // disagrees with lastOffsetDelta, a record length past its fields —
    // INVALID_RECORD (the bytes arrived as sent; clients do not retry it),
    // as Kafka's InvalidRecordException.
    let lies: [(usize, &[u8]); 3] = [
        (57, &0x7FFF_FFF0u32.to_be_bytes()),
        (57, &2u32.to_be_bytes()),
        (61, &[0x7e]),
    ];
    for (at, bytes) in lies {
        let mut b = batch(-1, -1, -1, &[b"x"]).to_vec();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        let r: ProduceResponse = call(&mut s, ApiKey::Produce, 9, &produce_req("c", Bytes::from(b))).await?;
        assert_eq!(partition(&r).0, rokka_kafka::errors::INVALID_RECORD, "lie at byte {at}");
    }
    // Two batches for one partition (v3+: one only, Kafka's
    // validateRecords): refused whole, neither stored.
    let mut two = batch(-1, -1, -1, &[b"first"]).to_vec();
    two.extend_from_slice(&batch(-1, -1, -1, &[b"second"]));
    let r: ProduceResponse = call(&mut s, ApiKey::Produce, 9, &produce_req("c", Bytes::from(two))).await?;
    assert_eq!(partition(&r).0, rokka_kafka::errors::INVALID_RECORD);
    // Nothing of it was stored.
    assert_eq!(
        partition(
            &call(
                &mut s,
                ApiKey::Produce,
                9,
                &produce_req("c", batch(-1, -1, -1, &[b"ok"]))
            )
            .await?
        )
        .1,
        0
    );
    Ok(())
}

#[tokio::test]
async fn bad_frames_close_only_their_connection() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut good = TcpStream::connect(addr).await?;
    // Oversized length.
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(&i32::MAX.to_be_bytes()).await?;
    assert!(closed(&mut s).await);
    // Unknown API key.
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(&[0, 0, 0, 8, 0x7f, 0x00, 0, 0, 0, 0, 0, 1]).await?;
    assert!(closed(&mut s).await);
    // Truncated body of a known API.
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(&[0, 0, 0, 10, 0, 3, 0, 9, 0, 0, 0, 1, 0xff, 0xff]).await?;
    assert!(closed(&mut s).await);
    // An unsupported ApiVersions version gets a v0 error response.
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(&[0, 0, 0, 10, 0, 18, 0, 99, 0, 0, 0, 5, 0, 0]).await?;
    let len = s.read_i32().await? as usize;
    let mut b = vec![0u8; len];
    s.read_exact(&mut b).await?;
    assert_eq!(&b[0..4], &5i32.to_be_bytes());
    assert_eq!(
        i16::from_be_bytes([b[4], b[5]]),
        rokka_kafka::errors::UNSUPPORTED_VERSION
    );
    // The well-behaved connection still works.
    let v: ApiVersionsResponse = call(&mut good, ApiKey::ApiVersions, 3, &ApiVersionsRequest::default()).await?;
    assert_eq!(v.error_code, 0);
    assert!(v
        .api_keys
        .iter()
        .any(|k| k.api_key == ApiKey::Produce as i16 && k.max_version >= 9));
    Ok(())
}

/// Dynamic broker configs: the cluster default (resource name "", what
/// kafka-configs --entity-default sends; the Python clients refuse an empty
/// name) under this broker's own value, both in the synonyms of a topic's
/// config in the order Kafka gives them.
#[tokio::test]
async fn dynamic_broker_configs_layer_under_topic_configs() -> TestResult {
    use incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut s = TcpStream::connect(addr).await?;
    let create = CreateTopicsRequest::default().with_topics(vec![create_topics_request::CreatableTopic::default()
        .with_name(TopicName(StrBytes::from_static_str("dyn")))
        .with_num_partitions(1)
        .with_replication_factor(1)]);
    let r: CreateTopicsResponse = call(&mut s, ApiKey::CreateTopics, 5, &create).await?;
    assert_eq!(r.topics[0].error_code, 0);
    let set = |name: &'static str, key: &'static str, value: Option<&'static str>| {
        IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
            .with_resource_type(4)
            .with_resource_name(StrBytes::from_static_str(name))
            .with_configs(vec![AlterableConfig::default()
                .with_name(StrBytes::from_static_str(key))
                .with_config_operation(if value.is_some() { 0 } else { 1 })
                .with_value(value.map(StrBytes::from_static_str))])])
    };
    for (name, value) in [("", "600000"), ("0", "700000")] {
        let r: IncrementalAlterConfigsResponse = call(
            &mut s,
            ApiKey::IncrementalAlterConfigs,
            1,
            &set(name, "log.retention.ms", Some(value)),
        )
        .await?;
        assert_eq!(r.responses[0].error_code, 0, "{:?}", r.responses[0].error_message);
    }
    // Another broker's id is not this broker's to change.
    let r: IncrementalAlterConfigsResponse = call(
        &mut s,
        ApiKey::IncrementalAlterConfigs,
        1,
        &set("5", "log.retention.ms", Some("1")),
    )
    .await?;
    assert_eq!(r.responses[0].error_code, 42);
    let describe = |rtype: i8, name: &'static str| {
        DescribeConfigsRequest::default()
            .with_include_synonyms(true)
            .with_resources(vec![describe_configs_request::DescribeConfigsResource::default()
                .with_resource_type(rtype)
                .with_resource_name(StrBytes::from_static_str(name))
                .with_configuration_keys(Some(vec![
                    StrBytes::from_static_str("retention.ms"),
                    StrBytes::from_static_str("log.retention.ms"),
                ]))])
    };
    let r: DescribeConfigsResponse = call(&mut s, ApiKey::DescribeConfigs, 4, &describe(2, "dyn")).await?;
    let c = &r.results[0].configs[0];
    assert_eq!((c.value.as_deref(), c.config_source), (Some("700000"), 2));
    let chain: Vec<(String, i8)> = c
        .synonyms
        .iter()
        .map(|s| (s.value.as_deref().unwrap_or("").to_string(), s.source))
        .collect();
    assert_eq!(
        chain,
        [
            ("700000".to_string(), 2),
            ("600000".to_string(), 3),
            ((72u64 * 3_600_000).to_string(), 5)
        ]
    );
    // The cluster default described alone.
    let r: DescribeConfigsResponse = call(&mut s, ApiKey::DescribeConfigs, 4, &describe(4, "")).await?;
    let c = &r.results[0].configs;
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].value.as_deref(), c[0].config_source), (Some("600000"), 3));
    // This broker's value deleted: the cluster default applies.
    let r: IncrementalAlterConfigsResponse = call(
        &mut s,
        ApiKey::IncrementalAlterConfigs,
        1,
        &set("0", "log.retention.ms", None),
    )
    .await?;
    assert_eq!(r.responses[0].error_code, 0);
    let r: DescribeConfigsResponse = call(&mut s, ApiKey::DescribeConfigs, 4, &describe(2, "dyn")).await?;
    let c = &r.results[0].configs[0];
    assert_eq!((c.value.as_deref(), c.config_source), (Some("600000"), 3));
    Ok(())
}

/// An unknown FindCoordinator key type is INVALID_REQUEST (not taken as a
/// group); an idempotent producer at its last epoch gets a new id from
/// epoch 0 instead of its own id at epoch 0 (which its earlier batches fence).
#[tokio::test]
async fn unknown_coordinator_types_and_the_last_producer_epoch() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut c = TcpStream::connect(addr).await?;
    let r: FindCoordinatorResponse = call(
        &mut c,
        ApiKey::FindCoordinator,
        3,
        &FindCoordinatorRequest::default()
            .with_key(StrBytes::from_static_str("g"))
            .with_key_type(2),
    )
    .await?;
    assert_eq!(r.error_code, 42);
    let r: FindCoordinatorResponse = call(
        &mut c,
        ApiKey::FindCoordinator,
        4,
        &FindCoordinatorRequest::default()
            .with_coordinator_keys(vec![StrBytes::from_static_str("g")])
            .with_key_type(7),
    )
    .await?;
    assert_eq!(
        r.coordinators.iter().map(|c| c.error_code).collect::<Vec<_>>(),
        vec![42]
    );
    let r: FindCoordinatorResponse = call(
        &mut c,
        ApiKey::FindCoordinator,
        4,
        &FindCoordinatorRequest::default()
            .with_coordinator_keys(vec![StrBytes::from_static_str("g")])
            .with_key_type(0),
    )
    .await?;
    assert_eq!(r.coordinators.iter().map(|c| c.error_code).collect::<Vec<_>>(), vec![0]);
    let init = |id: i64, epoch: i16| {
        InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(epoch)
    };
    // An empty transactional id is not null: INVALID_REQUEST, as Kafka.
    let r: InitProducerIdResponse = call(
        &mut c,
        ApiKey::InitProducerId,
        4,
        &init(-1, -1).with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("")))),
    )
    .await?;
    assert_eq!(r.error_code, 42);
    let r: InitProducerIdResponse = call(&mut c, ApiKey::InitProducerId, 4, &init(-1, -1)).await?;
    let id = r.producer_id.0;
    let r: InitProducerIdResponse = call(&mut c, ApiKey::InitProducerId, 4, &init(id, 3)).await?;
    assert_eq!((r.error_code, r.producer_id.0, r.producer_epoch), (0, id, 4));
    let r: InitProducerIdResponse = call(&mut c, ApiKey::InitProducerId, 4, &init(id, i16::MAX - 1)).await?;
    assert_eq!(r.error_code, 0);
    assert_ne!(r.producer_id.0, id);
    assert_eq!(r.producer_epoch, 0);
    Ok(())
}

/// DeleteRecords naming one partition many times is one deletion (the last
/// offset given) with one answer, as Kafka reads the request into a map.
#[tokio::test]
async fn delete_records_naming_a_partition_again_is_one_deletion() -> TestResult {
    use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut c = TcpStream::connect(addr).await?;
    let _: CreateTopicsResponse = call(
        &mut c,
        ApiKey::CreateTopics,
        5,
        &CreateTopicsRequest::default().with_topics(vec![
            kafka_protocol::messages::create_topics_request::CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("dr")))
                .with_num_partitions(1)
                .with_replication_factor(1),
        ]),
    )
    .await?;
    let values: Vec<Vec<u8>> = (0..10).map(|i| vec![b'a' + i]).collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
    let r: ProduceResponse = call(
        &mut c,
        ApiKey::Produce,
        9,
        &produce_req(
            "dr",
            Bytes::from(rokka_store::record::kafka::build_test_batch(&refs, 1_000)),
        ),
    )
    .await?;
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    let parts: Vec<DeleteRecordsPartition> = (0..5000)
        .map(|i| {
            DeleteRecordsPartition::default()
                .with_partition_index(0)
                .with_offset(if i == 4999 { 7 } else { 3 })
        })
        .collect();
    let started = std::time::Instant::now();
    let r: DeleteRecordsResponse = call(
        &mut c,
        ApiKey::DeleteRecords,
        2,
        &DeleteRecordsRequest::default()
            .with_timeout_ms(5000)
            .with_topics(vec![DeleteRecordsTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("dr")))
                .with_partitions(parts)]),
    )
    .await?;
    assert_eq!(r.topics.len(), 1);
    let got: Vec<(i32, i64, i16)> = r.topics[0]
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.low_watermark, p.error_code))
        .collect();
    assert_eq!(got, vec![(0, 7, 0)]);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    Ok(())
}

/// A partition named again in one Produce (under the same topic entry or a
/// repeated one) is refused INVALID_RECORD without its records being looked
/// at; the first occurrence is stored.
#[tokio::test]
async fn a_partition_named_twice_in_one_produce_is_stored_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut s = TcpStream::connect(addr).await?;
    let _: MetadataResponse = call(
        &mut s,
        ApiKey::Metadata,
        9,
        &MetadataRequest::default()
            .with_topics(Some(vec![
                kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_static_str("twice")))),
            ]))
            .with_allow_auto_topic_creation(true),
    )
    .await?;
    let part = |v: &'static [u8]| {
        PartitionProduceData::default()
            .with_index(0)
            .with_records(Some(batch(-1, -1, -1, &[v])))
    };
    let topic = |parts| {
        TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("twice")))
            .with_partition_data(parts)
    };
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![topic(vec![part(b"a"), part(b"b")]), topic(vec![part(b"c")])]);
    let r: ProduceResponse = call(&mut s, ApiKey::Produce, 9, &req).await?;
    let codes: Vec<i16> = r
        .responses
        .iter()
        .flat_map(|t| t.partition_responses.iter().map(|p| p.error_code))
        .collect();
    assert_eq!(codes, vec![0, 87, 87]);
    Ok(())
}

/// zstd before the versions that carry it is refused as Kafka refuses it:
/// a Produce below v7 holding a zstd batch, and a Fetch below v10 of a
/// topic whose compression.type is zstd, UNSUPPORTED_COMPRESSION_TYPE (76).
/// A damaged record is KAFKA_STORAGE_ERROR from Fetch v6 and
/// NOT_LEADER_OR_FOLLOWER before (a client that may not know error 56
/// retries that one; Kafka's maybeDownConvertStorageError).
#[tokio::test]
async fn zstd_and_storage_errors_follow_the_request_version() -> TestResult {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

    let dir = tempfile::tempdir()?;
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
    let broker = Arc::new(Broker::new(Arc::clone(&store), BrokerConfig::default())?);
    let mut zcfg = std::collections::BTreeMap::new();
    zcfg.insert("compression.type".to_string(), "zstd".to_string());
    broker.create_topic_with("z", 1, zcfg)?;
    broker.create_topic_with("plain", 1, Default::default())?;
    let (addr, _stop) = common::serve(Arc::clone(&broker)).await?;
    let mut s = TcpStream::connect(addr).await?;

    let record = Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: 1_000,
        key: None,
        value: Some(Bytes::from_static(b"zz")),
        headers: Default::default(),
    };
    let mut zstd = bytes::BytesMut::new();
    RecordBatchEncoder::encode(
        &mut zstd,
        [&record],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::Zstd,
        },
    )?;
    let zstd = zstd.freeze();
    for (version, want) in [(6, 76), (7, 0)] {
        let r: ProduceResponse = call(&mut s, ApiKey::Produce, version, &produce_req("plain", zstd.clone())).await?;
        assert_eq!(partition(&r).0, want, "Produce v{version}");
    }
    let r: ProduceResponse = call(&mut s, ApiKey::Produce, 9, &produce_req("z", zstd.clone())).await?;
    assert_eq!(partition(&r).0, 0);

    let fetch = |topic: &'static str| {
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_max_bytes(1 << 20)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str(topic)))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(0)
                    .with_partition_max_bytes(1 << 20)])])
    };
    let code = |r: &FetchResponse| r.responses[0].partitions[0].error_code;
    for (version, want) in [(9, 76), (10, 0)] {
        let r: FetchResponse = call(&mut s, ApiKey::Fetch, version, &fetch("z")).await?;
        assert_eq!(code(&r), want, "Fetch v{version} of a zstd topic");
    }

    // The plain topic's record, damaged on disk (a bad sector read back).
    let read = store.read("plain", 0, 0, 1, 1 << 20);
    let e = read.entries.first().ok_or("no record")?;
    let seg = dir.path().join("commitlog").join(format!("{:020}", 0));
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&seg)?;
    let pos = e.cq.phys_offset + u64::from(e.cq.size) - 1;
    let mut b = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, pos)?;
    std::os::unix::fs::FileExt::write_all_at(&f, &[b[0] ^ 0x5a], pos)?;
    for (version, want) in [(5, 6), (6, 56)] {
        let r: FetchResponse = call(&mut s, ApiKey::Fetch, version, &fetch("plain")).await?;
        assert_eq!(code(&r), want, "Fetch v{version} of a damaged record");
    }
    Ok(())
}

/// DescribeLogDirs' partition sizes are kept between requests and only the
/// entries appended since are added (each request summed every entry of
/// every partition): the sizes stay exact across appends and a new topic.
#[tokio::test]
async fn log_dir_sizes_follow_appends() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
    let broker = Arc::new(Broker::new(Arc::clone(&store), BrokerConfig::default())?);
    broker.create_topic("ld", 1)?;
    let (addr, _stop) = common::serve(Arc::clone(&broker)).await?;
    let mut s = TcpStream::connect(addr).await?;
    let size = |r: &DescribeLogDirsResponse| -> i64 {
        r.results
            .iter()
            .flat_map(|d| d.topics.iter())
            .filter(|t| t.name.0.as_str() == "ld")
            .flat_map(|t| t.partitions.iter())
            .map(|p| p.partition_size)
            .sum()
    };
    let mut want = 0i64;
    for round in 0..3 {
        for _ in 0..=round {
            let r = store.append_kafka_batch("ld", 0, &batch(-1, -1, -1, &[b"some value"]))?;
            want += i64::from(r.size);
        }
        let r: DescribeLogDirsResponse = call(
            &mut s,
            ApiKey::DescribeLogDirs,
            1,
            &DescribeLogDirsRequest::default().with_topics(None),
        )
        .await?;
        assert_eq!(size(&r), want, "round {round}");
    }
    // The topic deleted and made again, one batch in it: that batch only.
    broker.delete_topic("ld")?;
    broker.create_topic("ld", 1)?;
    let one = store.append_kafka_batch("ld", 0, &batch(-1, -1, -1, &[b"some value"]))?;
    let r: DescribeLogDirsResponse = call(
        &mut s,
        ApiKey::DescribeLogDirs,
        1,
        &DescribeLogDirsRequest::default().with_topics(None),
    )
    .await?;
    assert_eq!(size(&r), i64::from(one.size), "the new queue's bytes only");
    Ok(())
}

/// DescribeConfigs with an empty key list answers every config, as with
/// none (Kafka's ConfigHelper takes null or empty as "all").
#[tokio::test]
async fn describe_configs_with_an_empty_key_list_answers_every_config() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
    let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
    broker.create_topic("dc", 1)?;
    let (addr, _stop) = common::serve(broker).await?;
    let mut s = TcpStream::connect(addr).await?;
    let ask = |keys: Option<Vec<StrBytes>>| {
        DescribeConfigsRequest::default().with_resources(vec![
            kafka_protocol::messages::describe_configs_request::DescribeConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(StrBytes::from_static_str("dc"))
                .with_configuration_keys(keys),
        ])
    };
    let all: DescribeConfigsResponse = call(&mut s, ApiKey::DescribeConfigs, 1, &ask(None)).await?;
    let empty: DescribeConfigsResponse = call(&mut s, ApiKey::DescribeConfigs, 1, &ask(Some(Vec::new()))).await?;
    assert!(all.results[0].configs.len() > 10);
    assert_eq!(empty.results[0].configs.len(), all.results[0].configs.len());
    Ok(())
}
