//! The distlock conformance suite.
//!
//! One set of cases, written once against the `lock-core` contract, that every backend
//! runs against real servers: ours and any third party's. The cases, the harness trait and
//! the server provisioning are described in the project's design; this crate is where
//! they live.
