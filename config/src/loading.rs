//! What a gateway accepts as its plugin configuration, and the words it refuses one with:
//! one decision for the gateway (the filter's `glue::root`) and for `ratelimit-bridge
//! check-config`, so that a pipeline that checks a configuration offline sees exactly the
//! line the gateway would log.

use crate::config::Config;
use crate::error::ConfigError;

/// How a gateway's log line about a refused configuration begins.
pub const REFUSED: &str = "invalid plugin configuration";

/// Which build of the filter loads the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// `ratelimit.wasm`: checks through the bridge.
    Bridge,
    /// `ratelimit-redis.wasm` (Higress): the script on Redis through the host's redis call.
    RedisCall,
}

/// The configuration `json` as `build` would load it, or why it refuses it. `#[inline]`
/// for `Config::parse`'s sake: see there.
#[inline]
pub fn load(json: &[u8], build: Build) -> Result<Config, ConfigError> {
    let config = Config::parse(json)?;
    config.backend.validate_build(build == Build::RedisCall)?;
    Ok(config)
}

/// The line a gateway logs once it has loaded `config`.
pub fn accepted(config: &Config) -> String {
    format!("configured {} rule(s)", config.rules.len())
}

/// The line a gateway logs when it refuses a configuration for `error`.
pub fn refused(error: &ConfigError) -> String {
    format!("{REFUSED}: {error}")
}
