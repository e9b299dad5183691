//! ApiVersions: the honest table from `versions.rs`, and the features
//! block Kafka 3.x/4.x brokers send (v3+ tagged fields): the feature levels
//! Rokka implements.

use kafka_protocol::messages::api_versions_response::{ApiVersion, FinalizedFeatureKey, SupportedFeatureKey};
use kafka_protocol::messages::ApiVersionsResponse;
use kafka_protocol::protocol::StrBytes;

use crate::versions::SUPPORTED;

/// (feature, min, max): `group.version` 1 is the KIP-848 consumer protocol
/// (served); `transaction.version` 0 is transactions without KIP-890's
/// server-side verification (levels 1 and 2 need AddPartitionsToTxn v4+ /
/// EndTxn v5, not served).
pub const FEATURES: &[(&str, i16, i16)] = &[("group.version", 0, 1), ("transaction.version", 0, 0)];

pub fn handle(error_code: i16) -> ApiVersionsResponse {
    let api_keys = SUPPORTED
        .iter()
        .map(|(key, min, max)| {
            ApiVersion::default()
                .with_api_key(*key as i16)
                .with_min_version(*min)
                .with_max_version(*max)
        })
        .collect();
    ApiVersionsResponse::default()
        .with_error_code(error_code)
        .with_api_keys(api_keys)
        .with_supported_features(
            FEATURES
                .iter()
                .map(|(n, min, max)| {
                    SupportedFeatureKey::default()
                        .with_name(StrBytes::from_static_str(n))
                        .with_min_version(*min)
                        .with_max_version(*max)
                })
                .collect(),
        )
        .with_finalized_features_epoch(0)
        .with_finalized_features(
            FEATURES
                .iter()
                .map(|(n, _, max)| {
                    FinalizedFeatureKey::default()
                        .with_name(StrBytes::from_static_str(n))
                        .with_min_version_level(*max)
                        .with_max_version_level(*max)
                })
                .collect(),
        )
}
