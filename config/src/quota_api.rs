//! The top-level `quota_api` (`"quota_api": {"path": "/v1/quota"}`): a path on the gateway
//! where a client reads its own quota, every rule that applies to it with its limit, what is
//! left and when it is full again, as JSON, spending nothing (docs/quota-api.md). The filter
//! answers it; here is only what the configuration may say.

use crate::error::ConfigError;
use crate::matcher::normal_path;
use serde::Deserialize;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQuotaApi {
    path: String,
}

/// Where the quota API answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaApi {
    /// The path, in normal form (`path::normalize`): a request whose normalized path is
    /// this one, whatever its query, is answered by the gateway and never goes upstream.
    pub path: String,
}

impl RawQuotaApi {
    pub(crate) fn validate(self, field: &str) -> Result<QuotaApi, ConfigError> {
        normal_path(&format!("{field}.path"), &self.path)?;
        Ok(QuotaApi { path: self.path })
    }
}
