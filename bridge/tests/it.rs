//! The bridge's integration tests, one binary: each file of `bridge/tests/` is a module of
//! it (`bridge/tests/NAME.rs` is `NAME`, its tests `NAME::test`), sharing `common`, so that
//! the crate and its dependencies are linked once rather than once per file
//! (`autotests = false` in `bridge/Cargo.toml`). Run one file's tests with
//! `cargo test -p ratelimit-bridge --test it NAME::`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

mod access;
mod admin_access;
mod auth;
mod batch;
mod blocks;
mod calendar;
mod check_config;
mod claims;
mod cluster;
mod cluster_access;
mod grpc;
mod http;
mod keys;
mod leases;
mod ledger;
mod memory;
mod metrics;
mod override_lifetimes;
mod override_records;
mod overrides;
mod plans;
mod redis_outages;
mod resharding;
mod rls;
mod rls_conformance;
mod rls_environment;
mod rls_reference;
mod rls_reload;
mod rls_xds;
mod script;
mod sentinel;
mod settlements;
mod slots;
mod slowloris;
mod tls;
mod unread;

/// A file of `bridge/tests/` that is no module here would never be compiled or run: cargo
/// makes no binary of it (`autotests = false`).
#[test]
fn every_file_of_the_tests_folder_is_a_module_of_this_binary() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let this = std::fs::read_to_string(dir.join("it.rs")).unwrap();
    let declared: std::collections::BTreeSet<String> = this
        .lines()
        .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect();
    let files: std::collections::BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .filter_map(|path| Some(path.file_stem()?.to_str()?.to_string()))
        .filter(|name| name != "it")
        .chain(["common".to_string()])
        .collect();
    assert_eq!(declared, files);
}
