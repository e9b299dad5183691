//! Cluster mode with several broker sets: committed offsets of a queue
//! live with the queue's set (as RocketMQ keeps them), so a Kafka group
//! coordinator reads and writes those of other sets' queues on their
//! masters. The frontends see this trait; the RocketMQ frontend provides
//! it with the remoting codes a RocketMQ consumer uses
//! (UPDATE_CONSUMER_OFFSET, QUERY_CONSUMER_OFFSET).

use std::future::Future;
use std::pin::Pin;

/// A call to another set: its result, or why it failed (the caller answers
/// a retriable error rather than losing a commit).
pub type RemoteCall<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// One committed offset as another set keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteOffset {
    pub offset: u64,
    pub metadata: String,
    pub leader_epoch: i32,
}

pub trait RemoteOffsets: Send + Sync + std::fmt::Debug {
    /// Commits `offset` for (group, topic, queue) on the master of `set`.
    fn commit<'a>(
        &'a self,
        set: &'a str,
        group: &'a str,
        topic: &'a str,
        queue: u32,
        committed: RemoteOffset,
    ) -> RemoteCall<'a, ()>;

    /// Every (topic, queue) `group` has committed on the master of `set`,
    /// with the offset (what a Kafka OffsetFetch for all topics lists).
    fn group_offsets<'a>(&'a self, set: &'a str, group: &'a str) -> RemoteCall<'a, Vec<(String, u32, u64)>>;

    /// Deletes every offset `group` has committed on the master of `set`
    /// (Kafka DeleteGroups of a group whose partitions span sets); how many.
    fn delete_group<'a>(&'a self, set: &'a str, group: &'a str) -> RemoteCall<'a, u64>;

    /// What (group, topic, queue) has committed on the master of `set`.
    fn fetch<'a>(
        &'a self,
        set: &'a str,
        group: &'a str,
        topic: &'a str,
        queue: u32,
    ) -> RemoteCall<'a, Option<RemoteOffset>>;
}

/// Several broker sets: a Kafka transaction whose partitions, or whose
/// consumer group's offsets, live on other sets than its coordinator's.
/// The coordinator makes each such set a participant before answering
/// AddPartitionsToTxn (that set's master then takes the producer's
/// transactional batches), and ends the transaction there when it ends
/// (that master writes the COMMIT or ABORT markers and applies or drops
/// the offsets its group coordinator held for it), as Kafka's coordinator
/// sends WriteTxnMarkers to every partition leader.
pub trait RemoteTxns: Send + Sync + std::fmt::Debug {
    /// Makes the master of `set` a participant of producer `producer_id`'s
    /// transaction (coordinated by set `coordinator`) for `partitions`
    /// (topic, queue of that set). `Err((kafka_code, why))`: the
    /// participant's refusal (a Kafka error code), or -1 when it was not
    /// reached.
    fn join<'a>(
        &'a self,
        set: &'a str,
        coordinator: &'a str,
        producer_id: i64,
        epoch: i16,
        partitions: &'a [(String, u32)],
    ) -> RemoteCall<'a, Result<(), i16>>;

    /// Ends producer `producer_id`'s transaction on the master of `set`
    /// (markers under `epoch`); done when that master says so (a
    /// participant that no longer holds it says so too).
    fn end<'a>(&'a self, set: &'a str, producer_id: i64, epoch: i16, commit: bool) -> RemoteCall<'a, ()>;
}

/// Cluster mode: topics are created in the cluster's table (etcd) first,
/// so two nodes creating one topic at once (a Kafka CreateTopics on one, an
/// auto-creation on another) end with one record, as Kafka's controller
/// decides. Called from blocking contexts ([`crate::offload`]).
pub trait ClusterTopics: Send + Sync + std::fmt::Debug {
    /// Writes `info` (its cluster form) for `name` unless a record exists:
    /// `Ok(None)` when this call created it, `Ok(Some(existing))` when
    /// another node had (the caller takes that record).
    fn create(&self, name: &str, info: &crate::TopicInfo) -> Result<Option<crate::TopicInfo>, String>;

    /// The cluster's record of `name` (its cluster form), read now: for a
    /// node asked about a topic another node created a moment ago, before
    /// its own table sync took it.
    fn get<'a>(&'a self, name: &'a str) -> RemoteCall<'a, Option<crate::TopicInfo>>;
}

/// A state table that reaches a set's replicas with the replication stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// Committed offsets (both protocols).
    Offsets,
    /// The Kafka groups as of their last completed rebalance.
    KafkaGroups,
    /// The Kafka transaction state (coordinator's and participants').
    KafkaTxns,
    /// The queue starts Kafka DeleteRecords raised.
    LogStarts,
}

/// Cluster mode: the committed-offset table and the Kafka groups reach the
/// set's in-sync replicas with the replication stream; a Kafka
/// OffsetCommit, and a SyncGroup completing a rebalance, are answered once
/// they hold it (as Kafka writes its offsets topic with acks=all), so what
/// the client was told of survives its set's failover.
pub trait ReplicatedTables: Send + Sync + std::fmt::Debug {
    /// Waits until every in-sync replica holds `table` as of `version`
    /// (at once with none); an error when this node is no longer master or
    /// the replicas did not confirm within the replication timeout, or
    /// `within` when that is shorter.
    fn replicated(&self, table: Table, version: u64, within: Option<std::time::Duration>) -> RemoteCall<'_, ()>;
}

/// Cluster mode: the Kafka group coordinator's groups (members, generation,
/// assignment as of each group's last completed rebalance) go to the set's
/// replicas with the replication stream, so a replica taking over
/// coordinates them without making every member rejoin (Kafka keeps them
/// in `__consumer_offsets` for the same reason).
pub trait ReplicatedGroups: Send + Sync + std::fmt::Debug {
    /// Counts changes of [`ReplicatedGroups::snapshot`] (may count more).
    fn changes(&self) -> u64;
    /// The groups as a coordinator taking over loads them (encoded once
    /// per change; may block: call it off the runtime): the classic groups,
    /// and the KIP-848 consumer groups apart (empty when there are none),
    /// so a replica of a version without them still reads the first.
    fn snapshot(&self) -> (bytes::Bytes, bytes::Bytes);
    /// A replica: replaces its groups with a master's snapshot (`consumer`
    /// None or empty: none); how many (may block: call it off the runtime).
    fn load(&self, classic: &[u8], consumer: Option<&[u8]>) -> Result<usize, String>;
}
