//! The error every part of the configuration reports: the JSON path of the field at fault
//! and what is wrong with it. Its own module so that the parts (limits, backend) and the
//! whole (config) all use it without importing each other.

use std::fmt;

/// A configuration error, e.g. `rules[0].limit.per: "soon" is not a duration`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

/// `Err(ConfigError)` for `field`.
pub fn err<T>(field: impl Into<String>, problem: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError {
        field: field.into(),
        problem: problem.into(),
    })
}
