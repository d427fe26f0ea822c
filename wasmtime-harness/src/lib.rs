//! A native proxy-wasm host on wasmtime.
