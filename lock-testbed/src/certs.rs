//! Certificates for TLS tests, made with `rcgen`: a certificate authority, and server and
//! client certificates that it signs (a server's for `127.0.0.1`). Keys are unencrypted
//! ECDSA P-256, in PKCS#8 PEM files.
//!
//! ```no_run
//! use lock_testbed::certs;
//!
//! # fn demo() -> Result<(), lock_testbed::servers::ServerError> {
//! let dir = tempfile::tempdir()?;
//! certs::authority(dir.path(), "ca")?; // ca.crt, ca.key
//! certs::server_certificate(dir.path(), "ca")?; // server.crt, server.key
//! # Ok(()) }
//! ```

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::servers::ServerError;

/// Makes a self-signed certificate authority in `dir`: `{name}.crt` and `{name}.key`.
///
/// # Errors
///
/// [`ServerError::Io`] when a file cannot be written.
pub fn authority(dir: &Path, name: &str) -> Result<(), ServerError> {
    let key = KeyPair::generate().map_err(failed)?;
    let certificate = authority_params().self_signed(&key).map_err(failed)?;
    write(dir, name, &certificate.pem(), &key)
}

/// Makes `server.crt` and `server.key` in `dir`: a certificate for `127.0.0.1` signed by
/// the authority `{ca}.crt`/`{ca}.key` there (made by [`authority`]).
///
/// # Errors
///
/// [`ServerError::Io`] when the authority's key cannot be read or a file written.
pub fn server_certificate(dir: &Path, ca: &str) -> Result<(), ServerError> {
    let mut params = leaf_params("127.0.0.1", ExtendedKeyUsagePurpose::ServerAuth);
    params.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
    signed_certificate(dir, ca, "server", &params)
}

/// Makes `{name}.crt` and `{name}.key` in `dir`: a client certificate (common name `name`)
/// signed by the authority `{ca}.crt`/`{ca}.key` there, for servers that ask clients for
/// one (mutual TLS).
///
/// # Errors
///
/// As for [`server_certificate`].
pub fn client_certificate(dir: &Path, ca: &str, name: &str) -> Result<(), ServerError> {
    let params = leaf_params(name, ExtendedKeyUsagePurpose::ClientAuth);
    signed_certificate(dir, ca, name, &params)
}

/// The authority's name and uses: every authority made here is the same but for its key,
/// so that it signs from its key file alone.
fn authority_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "distlock test CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

/// A certificate for `common_name` that is not an authority, used for `usage`.
fn leaf_params(common_name: &str, usage: ExtendedKeyUsagePurpose) -> CertificateParams {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params
}

/// Makes `{name}.crt` and `{name}.key` in `dir` from `params`, signed by the authority
/// whose key is `{ca}.key` there.
fn signed_certificate(
    dir: &Path,
    ca: &str,
    name: &str,
    params: &CertificateParams,
) -> Result<(), ServerError> {
    let ca_key = std::fs::read_to_string(dir.join(format!("{ca}.key")))?;
    let issuer = Issuer::new(
        authority_params(),
        KeyPair::from_pem(&ca_key).map_err(failed)?,
    );
    let key = KeyPair::generate().map_err(failed)?;
    let certificate = params.signed_by(&key, &issuer).map_err(failed)?;
    write(dir, name, &certificate.pem(), &key)
}

/// Writes `{name}.crt` and `{name}.key` in `dir`.
fn write(dir: &Path, name: &str, certificate: &str, key: &KeyPair) -> Result<(), ServerError> {
    std::fs::write(dir.join(format!("{name}.crt")), certificate)?;
    std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem())?;
    Ok(())
}

fn failed(error: rcgen::Error) -> ServerError {
    ServerError::Io(std::sync::Arc::new(std::io::Error::other(format!(
        "making a certificate: {error}"
    ))))
}
