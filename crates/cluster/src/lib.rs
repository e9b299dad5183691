//! Cluster mode (docs/cluster.md, docs/decisions/0004-cluster-on-etcd.md).
