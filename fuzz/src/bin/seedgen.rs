//! Writes the seed corpora under `fuzz/corpus/<target>/` (run by
//! `bash fuzz/run.sh seeds`; the outputs are committed):
//!
//! * `kafka_request`: every served API key and version with a default body,
//!   and populated requests of the main APIs as librdkafka-like clients
//!   send them (Produce carries real batches of every codec), plus the
//!   18-byte Metadata request with a lying count (the abort);
//! * `rocketmq_frame`: the golden frames captured from a real RocketMQ
//!   client (`protocols/remoting/tests/golden`), each also re-encoded with
//!   the other header type, request streams of whole connections, and a
//!   REGISTER_BROKER as Rokka's registrar sends it;
//! * `kafka_batch_convert`: batches of every codec with keys, tags and
//!   headers (as a producer sends them, and as stored entries), stored
//!   RocketMQ messages with their properties;
//! * `recovery`: CommitLog segments written by the real store (RocketMQ
//!   messages, transactions, Kafka batches), after a clean close and after
//!   a crash, with their checkpoints.
//!
//! Usage: `seedgen <fuzz dir>`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use rokka_store::record::kafka::{self as kbatch, KafkaPlacement};
use rokka_store::record::message::{self, MessageInput, Placement};
use rokka_store::{MessageStore, StoreConfig};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

struct Out {
    dir: PathBuf,
    n: usize,
    bytes: usize,
}

impl Out {
    fn new(root: &Path, target: &str) -> Res<Out> {
        let dir = root.join("corpus").join(target);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        Ok(Out { dir, n: 0, bytes: 0 })
    }

    fn put(&mut self, name: &str, data: &[u8]) -> Res {
        std::fs::write(self.dir.join(name), data)?;
        self.n += 1;
        self.bytes += data.len();
        Ok(())
    }

    fn done(&self) {
        println!("{}: {} seeds, {} bytes", self.dir.display(), self.n, self.bytes);
    }
}

fn s(v: &'static str) -> StrBytes {
    StrBytes::from_static_str(v)
}

// ---- Kafka ------------------------------------------------------------

fn record(i: i64, tag: Option<&'static str>) -> Record {
    let mut headers = IndexMap::new();
    if let Some(t) = tag {
        headers.insert(s("rocketmq.tags"), Some(Bytes::from_static(t.as_bytes())));
    }
    headers.insert(s("trace-id"), Some(Bytes::from(format!("t-{i}"))));
    headers.insert(s("empty"), None);
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: i,
        sequence: i as i32,
        timestamp: 1_700_000_000_000 + i,
        key: (i % 3 != 2).then(|| Bytes::from(format!("key-{i}"))),
        value: (i % 4 != 3).then(|| Bytes::from(format!("value {i} of a message"))),
        headers,
    }
}

fn batch(n: i64, compression: Compression) -> Res<Bytes> {
    let tags = [Some("TagA"), Some("TagB"), None];
    let recs: Vec<Record> = (0..n).map(|i| record(i, tags[(i % 3) as usize])).collect();
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut out,
        &recs,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )?;
    Ok(out.freeze())
}

const CODECS: [(Compression, &str); 5] = [
    (Compression::None, "none"),
    (Compression::Gzip, "gzip"),
    (Compression::Snappy, "snappy"),
    (Compression::Lz4, "lz4"),
    (Compression::Zstd, "zstd"),
];

fn kafka_frame(key: ApiKey, version: i16, req: &RequestKind) -> Option<Vec<u8>> {
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .with_client_id(Some(s("rdkafka")))
        .encode(&mut buf, key.request_header_version(version))
        .ok()?;
    req.encode(&mut buf, version).ok()?;
    Some(buf.to_vec())
}

fn defaults(key: ApiKey) -> Option<RequestKind> {
    Some(match key {
        ApiKey::Produce => RequestKind::Produce(Default::default()),
        ApiKey::Fetch => RequestKind::Fetch(Default::default()),
        ApiKey::ListOffsets => RequestKind::ListOffsets(Default::default()),
        ApiKey::Metadata => RequestKind::Metadata(Default::default()),
        ApiKey::OffsetCommit => RequestKind::OffsetCommit(Default::default()),
        ApiKey::OffsetFetch => RequestKind::OffsetFetch(Default::default()),
        ApiKey::FindCoordinator => RequestKind::FindCoordinator(Default::default()),
        ApiKey::JoinGroup => RequestKind::JoinGroup(Default::default()),
        ApiKey::Heartbeat => RequestKind::Heartbeat(Default::default()),
        ApiKey::LeaveGroup => RequestKind::LeaveGroup(Default::default()),
        ApiKey::SyncGroup => RequestKind::SyncGroup(Default::default()),
        ApiKey::DescribeGroups => RequestKind::DescribeGroups(Default::default()),
        ApiKey::ListGroups => RequestKind::ListGroups(Default::default()),
        ApiKey::ApiVersions => RequestKind::ApiVersions(Default::default()),
        ApiKey::CreateTopics => RequestKind::CreateTopics(Default::default()),
        ApiKey::DeleteTopics => RequestKind::DeleteTopics(Default::default()),
        ApiKey::CreatePartitions => RequestKind::CreatePartitions(Default::default()),
        ApiKey::InitProducerId => RequestKind::InitProducerId(Default::default()),
        ApiKey::DeleteGroups => RequestKind::DeleteGroups(Default::default()),
        ApiKey::DescribeConfigs => RequestKind::DescribeConfigs(Default::default()),
        ApiKey::DescribeCluster => RequestKind::DescribeCluster(Default::default()),
        ApiKey::DeleteRecords => RequestKind::DeleteRecords(Default::default()),
        ApiKey::OffsetDelete => RequestKind::OffsetDelete(Default::default()),
        _ => return None,
    })
}

fn topic(name: &'static str) -> TopicName {
    TopicName(s(name))
}

fn group(name: &'static str) -> GroupId {
    GroupId(s(name))
}

/// Requests with their collections filled, as clients send them.
fn populated(key: ApiKey, records: &Bytes) -> Vec<RequestKind> {
    use kafka_protocol::messages::*;
    match key {
        ApiKey::Produce => vec![RequestKind::Produce(
            ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(30_000)
                .with_topic_data(vec![produce_request::TopicProduceData::default()
                    .with_name(topic("orders"))
                    .with_partition_data(vec![
                        produce_request::PartitionProduceData::default()
                            .with_index(0)
                            .with_records(Some(records.clone())),
                        produce_request::PartitionProduceData::default().with_index(1),
                    ])]),
        )],
        ApiKey::Fetch => vec![RequestKind::Fetch(
            FetchRequest::default()
                .with_max_wait_ms(500)
                .with_min_bytes(1)
                .with_max_bytes(52_428_800)
                .with_session_epoch(-1)
                .with_topics(vec![fetch_request::FetchTopic::default()
                    .with_topic(topic("orders"))
                    .with_partitions(vec![
                        fetch_request::FetchPartition::default()
                            .with_partition(0)
                            .with_fetch_offset(5)
                            .with_partition_max_bytes(1_048_576),
                        fetch_request::FetchPartition::default().with_partition(3),
                    ])])
                .with_forgotten_topics_data(vec![fetch_request::ForgottenTopic::default()
                    .with_topic(topic("old"))
                    .with_partitions(vec![1, 2])])
                .with_rack_id(s("rack-a")),
        )],
        ApiKey::Metadata => vec![
            RequestKind::Metadata(MetadataRequest::default().with_topics(Some(vec![
                metadata_request::MetadataRequestTopic::default().with_name(Some(topic("orders"))),
                metadata_request::MetadataRequestTopic::default().with_name(Some(topic("payments"))),
            ]))),
            RequestKind::Metadata(
                MetadataRequest::default()
                    .with_topics(None)
                    .with_allow_auto_topic_creation(true),
            ),
        ],
        ApiKey::ListOffsets => vec![RequestKind::ListOffsets(
            ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(vec![list_offsets_request::ListOffsetsTopic::default()
                    .with_name(topic("orders"))
                    .with_partitions(vec![
                        list_offsets_request::ListOffsetsPartition::default()
                            .with_partition_index(0)
                            .with_timestamp(-1),
                        list_offsets_request::ListOffsetsPartition::default()
                            .with_partition_index(1)
                            .with_timestamp(-2),
                    ])]),
        )],
        ApiKey::OffsetCommit => vec![RequestKind::OffsetCommit(
            OffsetCommitRequest::default()
                .with_group_id(group("g1"))
                .with_generation_id_or_member_epoch(3)
                .with_member_id(s("rdkafka-1"))
                .with_topics(vec![offset_commit_request::OffsetCommitRequestTopic::default()
                    .with_name(topic("orders"))
                    .with_partitions(vec![
                        offset_commit_request::OffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(42)
                            .with_committed_metadata(Some(s("meta"))),
                    ])]),
        )],
        ApiKey::OffsetFetch => vec![
            RequestKind::OffsetFetch(
                OffsetFetchRequest::default()
                    .with_group_id(group("g1"))
                    .with_topics(Some(vec![offset_fetch_request::OffsetFetchRequestTopic::default()
                        .with_name(topic("orders"))
                        .with_partition_indexes(vec![0, 1, 2])])),
            ),
            RequestKind::OffsetFetch(OffsetFetchRequest::default().with_groups(vec![
                offset_fetch_request::OffsetFetchRequestGroup::default()
                    .with_group_id(group("g1"))
                    .with_topics(Some(vec![offset_fetch_request::OffsetFetchRequestTopics::default()
                        .with_name(topic("orders"))
                        .with_partition_indexes(vec![0, 1])])),
            ])),
        ],
        ApiKey::FindCoordinator => vec![RequestKind::FindCoordinator(
            FindCoordinatorRequest::default()
                .with_key(s("g1"))
                .with_coordinator_keys(vec![s("g1"), s("g2")]),
        )],
        ApiKey::JoinGroup => vec![RequestKind::JoinGroup(
            JoinGroupRequest::default()
                .with_group_id(group("g1"))
                .with_session_timeout_ms(45_000)
                .with_rebalance_timeout_ms(300_000)
                .with_protocol_type(s("consumer"))
                .with_protocols(vec![
                    join_group_request::JoinGroupRequestProtocol::default()
                        .with_name(s("range"))
                        .with_metadata(Bytes::from_static(
                            b"\x00\x01\x00\x00\x00\x01\x00\x06orders\xff\xff\xff\xff",
                        )),
                    join_group_request::JoinGroupRequestProtocol::default()
                        .with_name(s("roundrobin"))
                        .with_metadata(Bytes::from_static(b"\x00\x00")),
                ]),
        )],
        ApiKey::SyncGroup => vec![RequestKind::SyncGroup(
            SyncGroupRequest::default()
                .with_group_id(group("g1"))
                .with_generation_id(1)
                .with_member_id(s("m1"))
                .with_protocol_type(Some(s("consumer")))
                .with_protocol_name(Some(s("range")))
                .with_assignments(vec![sync_group_request::SyncGroupRequestAssignment::default()
                    .with_member_id(s("m1"))
                    .with_assignment(Bytes::from_static(
                        b"\x00\x01\x00\x00\x00\x01\x00\x06orders\x00\x00\x00\x01\x00\x00\x00\x00\xff\xff\xff\xff",
                    ))]),
        )],
        ApiKey::Heartbeat => vec![RequestKind::Heartbeat(
            HeartbeatRequest::default()
                .with_group_id(group("g1"))
                .with_generation_id(1)
                .with_member_id(s("m1")),
        )],
        ApiKey::LeaveGroup => vec![RequestKind::LeaveGroup(
            LeaveGroupRequest::default()
                .with_group_id(group("g1"))
                .with_member_id(s("m1"))
                .with_members(vec![
                    leave_group_request::MemberIdentity::default().with_member_id(s("m1"))
                ]),
        )],
        ApiKey::DescribeGroups => vec![RequestKind::DescribeGroups(
            DescribeGroupsRequest::default().with_groups(vec![group("g1"), group("g2")]),
        )],
        ApiKey::DeleteGroups => vec![RequestKind::DeleteGroups(
            DeleteGroupsRequest::default().with_groups_names(vec![group("g1")]),
        )],
        ApiKey::ApiVersions => vec![RequestKind::ApiVersions(
            ApiVersionsRequest::default()
                .with_client_software_name(s("librdkafka"))
                .with_client_software_version(s("2.3.0")),
        )],
        ApiKey::CreateTopics => vec![RequestKind::CreateTopics(
            CreateTopicsRequest::default().with_timeout_ms(5_000).with_topics(vec![
                create_topics_request::CreatableTopic::default()
                    .with_name(topic("new-topic"))
                    .with_num_partitions(4)
                    .with_replication_factor(1)
                    .with_configs(vec![create_topics_request::CreatableTopicConfig::default()
                        .with_name(s("retention.ms"))
                        .with_value(Some(s("60000")))]),
            ]),
        )],
        ApiKey::DeleteTopics => vec![RequestKind::DeleteTopics(
            DeleteTopicsRequest::default()
                .with_topic_names(vec![topic("old")])
                .with_topics(vec![
                    delete_topics_request::DeleteTopicState::default().with_name(Some(topic("old")))
                ]),
        )],
        ApiKey::CreatePartitions => vec![RequestKind::CreatePartitions(
            CreatePartitionsRequest::default().with_topics(vec![
                create_partitions_request::CreatePartitionsTopic::default()
                    .with_name(topic("orders"))
                    .with_count(8),
            ]),
        )],
        ApiKey::InitProducerId => vec![RequestKind::InitProducerId(
            InitProducerIdRequest::default()
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        )],
        ApiKey::DescribeConfigs => vec![RequestKind::DescribeConfigs(
            DescribeConfigsRequest::default().with_resources(vec![
                describe_configs_request::DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s("orders"))
                    .with_configuration_keys(Some(vec![s("retention.ms")])),
            ]),
        )],
        ApiKey::DeleteRecords => vec![RequestKind::DeleteRecords(DeleteRecordsRequest::default().with_topics(
            vec![delete_records_request::DeleteRecordsTopic::default()
                .with_name(topic("orders"))
                .with_partitions(vec![delete_records_request::DeleteRecordsPartition::default()
                    .with_partition_index(0)
                    .with_offset(10)])],
        ))],
        ApiKey::OffsetDelete => vec![RequestKind::OffsetDelete(
            OffsetDeleteRequest::default()
                .with_group_id(group("g1"))
                .with_topics(vec![offset_delete_request::OffsetDeleteRequestTopic::default()
                    .with_name(topic("orders"))
                    .with_partitions(vec![
                        offset_delete_request::OffsetDeleteRequestPartition::default().with_partition_index(0),
                    ])]),
        )],
        _ => Vec::new(),
    }
}

fn kafka_request(root: &Path) -> Res {
    let mut out = Out::new(root, "kafka_request")?;
    for &(key, min, max) in rokka_kafka::versions::SUPPORTED {
        let name = format!("{key:?}").to_lowercase();
        for v in min..=max {
            if let Some(f) = defaults(key).and_then(|d| kafka_frame(key, v, &d)) {
                out.put(&format!("{name}-v{v}-default"), &f)?;
            }
            for (i, req) in populated(key, &batch(3, Compression::None)?).iter().enumerate() {
                if let Some(f) = kafka_frame(key, v, req) {
                    out.put(&format!("{name}-v{v}-{i}"), &f)?;
                }
            }
        }
    }
    // Produce v9 with a batch of every codec.
    for (c, cname) in CODECS {
        for (i, req) in populated(ApiKey::Produce, &batch(4, c)?).iter().enumerate() {
            if let Some(f) = kafka_frame(ApiKey::Produce, 9, req) {
                out.put(&format!("produce-v9-{cname}-{i}"), &f)?;
            }
        }
    }
    // The 18-byte abort: Metadata v1, topic count 0x7FFFFFFF.
    let mut m = Vec::new();
    m.extend_from_slice(&3i16.to_be_bytes());
    m.extend_from_slice(&1i16.to_be_bytes());
    m.extend_from_slice(&1i32.to_be_bytes());
    m.extend_from_slice(&(-1i16).to_be_bytes());
    m.extend_from_slice(&0x7FFF_FFFFi32.to_be_bytes());
    out.put("metadata-v1-lying-count", &m)?;
    out.done();
    Ok(())
}

// ---- RocketMQ -----------------------------------------------------------

fn unhex(s: &str) -> Res<Vec<u8>> {
    let s = s.trim();
    (0..s.len())
        .step_by(2)
        .map(|i| Ok(u8::from_str_radix(&s[i..i + 2], 16)?))
        .collect()
}

fn rocketmq_frame(root: &Path, repo: &Path) -> Res {
    let mut out = Out::new(root, "rocketmq_frame")?;
    let golden = repo.join("protocols/remoting/tests/golden");
    let mut names: Vec<_> = std::fs::read_dir(&golden)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "hex"))
        .collect();
    names.sort();
    let mut streams: std::collections::BTreeMap<String, Vec<u8>> = Default::default();
    for p in &names {
        let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("frame").to_string();
        let frame = unhex(&std::fs::read_to_string(p)?)?;
        out.put(&stem, &frame)?;
        // The same command with the other header serialization.
        let mut buf = BytesMut::from(&frame[..]);
        if let Ok(Some(mut cmd)) = rokka_remoting::decode(&mut buf, rokka_remoting::DEFAULT_MAX_FRAME) {
            cmd.serialize_type = match cmd.serialize_type {
                rokka_remoting::SerializeType::Json => rokka_remoting::SerializeType::RocketMq,
                rokka_remoting::SerializeType::RocketMq => rokka_remoting::SerializeType::Json,
            };
            let mut other = BytesMut::new();
            rokka_remoting::encode(&cmd, &mut other);
            out.put(&format!("{stem}-other-header"), &other)?;
        }
        // Request streams: a capture's requests back to back.
        if stem.contains("-req-") {
            let capture = stem.split("-req-").next().unwrap_or("x").to_string();
            let s = streams.entry(capture).or_default();
            if s.len() + frame.len() <= 8 * 1024 {
                s.extend_from_slice(&frame);
            }
        }
    }
    for (capture, s) in streams {
        out.put(&format!("{capture}-stream"), &s)?;
    }
    // REGISTER_BROKER as Rokka's registrar sends it to a name server.
    let reg = rokka_remoting::namesrv::Registration {
        cluster: "DefaultCluster".into(),
        broker_name: "rokka".into(),
        broker_addr: "127.0.0.1:10911".into(),
        broker_id: 0,
        ha_addr: String::new(),
        timeout_ms: Some(30_000),
        data_version: 3,
        topics: vec![rokka_remoting::namesrv::TopicConf {
            name: "orders".into(),
            read_queues: 4,
            write_queues: 4,
            perm: 6,
            sys_flag: 0,
        }],
    };
    let mut f = BytesMut::new();
    rokka_remoting::encode(&rokka_remoting::namesrv::wire::to_command(&reg, 9, 475), &mut f);
    out.put("register-broker", &f)?;
    out.done();
    Ok(())
}

// ---- conversion ---------------------------------------------------------

fn host() -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 7], 10911))
}

fn stored_message(topic: &str, body: &[u8], props: &[u8], v6: bool) -> Vec<u8> {
    let born: SocketAddr = if v6 {
        "[::1]:50000".parse().unwrap_or_else(|_| host())
    } else {
        SocketAddr::from(([192, 168, 1, 9], 50000))
    };
    let m = MessageInput {
        topic,
        queue_id: 1,
        flag: 0,
        body,
        properties: props,
        sys_flag: 0,
        born_timestamp: 1_700_000_000_000,
        born_host: born,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    };
    let mut buf = vec![0u8; message::encoded_len(&m, &host(), true)];
    message::encode(
        &mut buf,
        &m,
        &host(),
        Placement {
            queue_offset: 12,
            phys_offset: 4096,
            store_timestamp: 1_700_000_000_500,
            body_crc32: crc32fast::hash(body),
            record_crc: true,
        },
    );
    buf
}

fn kafka_batch_convert(root: &Path) -> Res {
    let mut out = Out::new(root, "kafka_batch_convert")?;
    for (c, cname) in CODECS {
        let b = batch(5, c)?;
        // Producer records: raw (flags 0), with fix-ups (12), tag filter (28).
        for flags in [0u8, 12, 28] {
            let mut v = vec![flags, 2];
            v.extend_from_slice(&b);
            out.put(&format!("producer-{cname}-flags{flags}"), &v)?;
        }
        // Two batches back to back, as one partition's records.
        let mut v = vec![12u8, 0];
        v.extend_from_slice(&b);
        v.extend_from_slice(&batch(2, Compression::None)?);
        out.put(&format!("producer-{cname}-two-batches"), &v)?;
        // The stored entry.
        let mut entry = vec![0u8; kbatch::encoded_len("orders", b.len())];
        kbatch::encode(
            &mut entry,
            "orders",
            &b,
            KafkaPlacement {
                queue_id: 2,
                queue_offset: 1000,
                phys_offset: 8192,
                store_timestamp: 1_700_000_000_000,
                count: 5,
            },
        );
        let mut v = vec![1u8, 1];
        v.extend_from_slice(&entry);
        out.put(&format!("stored-{cname}"), &v)?;
        v[0] = 13;
        out.put(&format!("stored-{cname}-fixups"), &v)?;
    }
    let props: [(&str, &[u8]); 4] = [
        (
            "plain",
            b"KEYS\x01order-1 order-2\x02TAGS\x01TagA\x02UNIQ_KEY\x01AC1100017F0018B4AAC2\x02color\x01red\x02",
        ),
        ("hexkey", b"KAFKA_KEY_HEX\x0100ff10\x02TAGS\x01TagB\x02"),
        ("system", b"DELAY\x013\x02REAL_TOPIC\x01x\x02WAIT\x01true\x02"),
        ("none", b""),
    ];
    for (name, p) in props {
        for (v6, suffix) in [(false, ""), (true, "-v6")] {
            let mut v = vec![2u8, 0];
            v.extend_from_slice(&stored_message("orders", b"hello body", p, v6));
            out.put(&format!("message-{name}{suffix}"), &v)?;
        }
    }
    out.done();
    Ok(())
}

// ---- recovery -----------------------------------------------------------

fn store_config(dir: &Path) -> StoreConfig {
    let mut c = StoreConfig::for_tests(dir);
    c.max_message_bytes = 16 * 1024;
    c.commitlog_segment_bytes = 128 * 1024;
    c.consume_queue_entries_per_file = 64;
    c.index_slots = 64;
    c.index_entries = 256;
    c.preallocate = false;
    c
}

fn fill(store: &MessageStore, variant: u32) -> Res {
    use rokka_store::record::message::sysflag;
    let topics = ["orders", "payments", "%RETRY%g1"];
    for i in 0..(4 + variant * 3) {
        let t = topics[(i % 3) as usize];
        let props = format!("KEYS\x01k{i}\x02TAGS\x01Tag{}\x02UNIQ_KEY\x01ID{i:08}\x02", i % 2);
        let body = format!("message body {i}");
        let mut m = MessageInput::new(t, i % 2, body.as_bytes(), props.as_bytes());
        if variant == 2 {
            m.sys_flag = [
                sysflag::TRANSACTION_PREPARED,
                sysflag::TRANSACTION_COMMIT,
                sysflag::TRANSACTION_ROLLBACK,
                0,
            ][(i % 4) as usize];
        }
        store.append_message(&m)?;
        if variant >= 1 && i % 3 == 0 {
            let b = batch(3, CODECS[(i as usize / 3) % CODECS.len()].0)?;
            store.append_kafka_batch("kafka-topic", i % 2, &b)?;
        }
    }
    Ok(())
}

fn recovery(root: &Path) -> Res {
    let mut out = Out::new(root, "recovery")?;
    let tmp = std::env::temp_dir().join(format!("rokka-seedgen-{}", std::process::id()));
    for variant in 0..3u32 {
        for clean in [true, false] {
            let _ = std::fs::remove_dir_all(&tmp);
            let store = MessageStore::open(store_config(&tmp))?;
            fill(&store, variant)?;
            if clean {
                store.close()?;
            } else {
                store.checkpoint()?;
            }
            drop(store);
            let seg = std::fs::read(tmp.join("commitlog").join(format!("{:020}", 0)))?;
            let used = seg.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
            let cp = std::fs::read(tmp.join("checkpoint"))?;
            let at = |i: usize| u64::from_be_bytes(cp[i..i + 8].try_into().unwrap_or([0; 8]));
            let (safe, last) = (at(8), at(24));
            // Checkpoint as written (clean or not), abort marker if a crash.
            let mut flags = 1u8 | if clean { 2 } else { 4 } | 16 | 64;
            let mut v = vec![flags];
            v.extend_from_slice(&(safe as u32).to_be_bytes());
            v.extend_from_slice(&(last as u32).to_be_bytes());
            v.extend_from_slice(&seg[..used]);
            out.put(
                &format!("store-{variant}-{}", if clean { "clean" } else { "crash" }),
                &v,
            )?;
            // No checkpoint at all: a full scan (once per log).
            if !clean {
                flags = 4 | 64;
                v[0] = flags;
                out.put(&format!("store-{variant}-no-checkpoint"), &v)?;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    // An empty log with a clean checkpoint at 0.
    out.put("empty-clean", &[3, 0, 0, 0, 0, 0, 0, 0, 0])?;
    out.done();
    Ok(())
}

fn main() -> Res {
    let root = PathBuf::from(std::env::args().nth(1).ok_or("usage: seedgen <fuzz dir>")?);
    let repo = root.join("..");
    kafka_request(&root)?;
    rocketmq_frame(&root, &repo)?;
    kafka_batch_convert(&root)?;
    recovery(&root)?;
    Ok(())
}
