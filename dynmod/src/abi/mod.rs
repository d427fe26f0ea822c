//! The part of Envoy's dynamic-module C ABI (`source/extensions/dynamic_modules/abi/abi.h`,
//! ABI v0.2.0 as Envoy 1.40 exports it) that the module uses: its types and the callbacks
//! Envoy exports, declared by hand and reviewed against the header, and thin calls over them
//! that turn every host answer into a value, never a panic. Envoy loads modules with
//! `RTLD_NOW`, so a callback declared here that the binary does not export stops the module
//! from loading at all rather than later.
//!
//! - `exports`: the callbacks, as the header declares them.
//! - `calls`: a safe call over each.
//! - `outbound`: those that reach the bridge (callouts and streams).

use std::ffi::c_void;

pub type ConfigEnvoyPtr = *mut c_void;
pub type FilterEnvoyPtr = *mut c_void;

/// Bytes Envoy owns, valid for the current hook.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

/// Bytes the module owns, lent for the call.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

#[repr(C)]
pub struct ModuleHeader {
    pub key: ModuleBuffer,
    pub value: ModuleBuffer,
}

#[repr(C)]
pub struct EnvoyHeader {
    pub key: EnvoyBuffer,
    pub value: EnvoyBuffer,
}

/// `envoy_dynamic_module_type_http_header_type`.
pub const REQUEST_HEADERS: i32 = 0;
pub const RESPONSE_HEADERS: i32 = 2;
/// `envoy_dynamic_module_type_http_body_type`.
pub const RECEIVED_REQUEST_BODY: i32 = 0;
pub const BUFFERED_REQUEST_BODY: i32 = 1;
pub const RECEIVED_RESPONSE_BODY: i32 = 2;
/// `envoy_dynamic_module_type_attribute_id`.
pub const SOURCE_ADDRESS: i32 = 24;
pub const XDS_ROUTE_NAME: i32 = 61;
/// `envoy_dynamic_module_type_http_callout_init_result_Success`, and `_result_Success`.
pub const CALLOUT_OK: i32 = 0;
/// `envoy_dynamic_module_type_metrics_result_Success`.
pub const METRICS_OK: i32 = 0;
/// `envoy_dynamic_module_type_log_level`.
pub const LOG_DEBUG: i32 = 1;
pub const LOG_INFO: i32 = 2;
pub const LOG_WARN: i32 = 3;
pub const LOG_ERROR: i32 = 4;

/// A request's scheduler: an event committed from any thread runs on the request's worker
/// (`on_http_filter_scheduled`), or nowhere once the request is gone; the scheduler itself
/// stays valid until deleted.
pub type FilterSchedulerPtr = *mut c_void;

/// A configuration's scheduler: an event committed from any thread runs on Envoy's main
/// thread (`on_http_filter_config_scheduled`).
pub type SchedulerPtr = *mut c_void;

mod calls;
mod exports;
mod outbound;

pub use calls::*;
pub use outbound::*;
