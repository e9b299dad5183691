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

/// The features as a request of `version` may be told them: before v4,
/// Java clients from 3.3 until the KAFKA-17011 fix refuse a supported range
/// whose minimum is 0 (their BaseVersionRange needs min ≥ 1: the
/// connection never becomes ready), so
/// Kafka (KAFKA-17011) raises such a minimum to 1 and leaves out a feature
/// whose maximum is 0 as well; a finalized level 0 (the feature off) is
/// never sent.
fn features(version: i16) -> (Vec<SupportedFeatureKey>, Vec<FinalizedFeatureKey>) {
    let supported = FEATURES
        .iter()
        .filter(|(_, _, max)| version >= 4 || *max > 0)
        .map(|(n, min, max)| {
            SupportedFeatureKey::default()
                .with_name(StrBytes::from_static_str(n))
                .with_min_version(if version < 4 { (*min).max(1) } else { *min })
                .with_max_version(*max)
        })
        .collect();
    let finalized = FEATURES
        .iter()
        .filter(|(_, _, max)| *max > 0)
        .map(|(n, _, max)| {
            FinalizedFeatureKey::default()
                .with_name(StrBytes::from_static_str(n))
                .with_min_version_level(*max)
                .with_max_version_level(*max)
        })
        .collect();
    (supported, finalized)
}

/// The answer to an ApiVersions request of `version`.
pub fn handle(error_code: i16, version: i16) -> ApiVersionsResponse {
    let api_keys = SUPPORTED
        .iter()
        .map(|(key, min, max)| {
            ApiVersion::default()
                .with_api_key(*key as i16)
                .with_min_version(*min)
                .with_max_version(*max)
        })
        .collect();
    let (supported, finalized) = features(version);
    ApiVersionsResponse::default()
        .with_error_code(error_code)
        .with_api_keys(api_keys)
        .with_supported_features(supported)
        .with_finalized_features_epoch(0)
        .with_finalized_features(finalized)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_requests_are_not_told_a_feature_range_starting_at_0() {
        let names = |r: &ApiVersionsResponse| -> Vec<(String, i16, i16)> {
            r.supported_features
                .iter()
                .map(|f| (f.name.to_string(), f.min_version, f.max_version))
                .collect()
        };
        let v3 = handle(0, 3);
        assert_eq!(names(&v3), vec![("group.version".to_string(), 1, 1)]);
        let v4 = handle(0, 4);
        assert_eq!(
            names(&v4),
            vec![
                ("group.version".to_string(), 0, 1),
                ("transaction.version".to_string(), 0, 0)
            ]
        );
        for r in [&v3, &v4] {
            let fin: Vec<(String, i16)> = r
                .finalized_features
                .iter()
                .map(|f| (f.name.to_string(), f.max_version_level))
                .collect();
            assert_eq!(fin, vec![("group.version".to_string(), 1)], "level 0 is not sent");
        }
        assert!(v3.supported_features.iter().all(|f| f.min_version >= 1));
    }
}
