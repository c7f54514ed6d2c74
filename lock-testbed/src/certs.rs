//! Certificates for TLS tests, made with the `openssl` command (Debian's `openssl`): a
//! certificate authority, and a server certificate for `127.0.0.1` that it signs. Valid for
//! two days; keys are unencrypted RSA 2048.
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

use std::path::Path;
use std::process::{Command, Stdio};

use crate::servers::ServerError;

/// Runs `openssl args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) -> Result<(), ServerError> {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|error| ServerError::NotInstalled {
            package: "openssl".to_owned(),
            detail: format!("the openssl command: {error}"),
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(ServerError::Protocol {
            server: "openssl".to_owned(),
            detail: format!("openssl {} failed: {status}", args.join(" ")),
        })
    }
}

/// Makes a self-signed certificate authority in `dir`: `{name}.crt` and `{name}.key`.
///
/// # Errors
///
/// [`ServerError::NotInstalled`] without the `openssl` command; [`ServerError::Protocol`]
/// when it fails.
pub fn authority(dir: &Path, name: &str) -> Result<(), ServerError> {
    let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=distlock test CA",
            "-keyout",
            &key,
            "-out",
            &crt,
        ],
    )
}

/// Makes `server.crt` and `server.key` in `dir`: a certificate for `127.0.0.1` signed by
/// the authority `{ca}.crt`/`{ca}.key` there (see [`authority`]).
///
/// # Errors
///
/// As for [`authority`], and [`ServerError::Io`] when a file cannot be written.
pub fn server_certificate(dir: &Path, ca: &str) -> Result<(), ServerError> {
    signed_certificate(
        dir,
        ca,
        "server",
        "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
}

/// Makes `{name}.crt` and `{name}.key` in `dir`: a client certificate (common name `name`)
/// signed by the authority `{ca}.crt`/`{ca}.key` there, for servers that ask clients for
/// one (mutual TLS).
///
/// # Errors
///
/// As for [`server_certificate`].
pub fn client_certificate(dir: &Path, ca: &str, name: &str) -> Result<(), ServerError> {
    let subject = format!("/CN={name}");
    signed_certificate(dir, ca, name, &subject, "extendedKeyUsage=clientAuth\n")
}

/// Makes `{name}.crt` and `{name}.key` in `dir` for `subject`, with the extensions
/// `usage` (besides those of every leaf), signed by the authority `{ca}`.
fn signed_certificate(
    dir: &Path,
    ca: &str,
    name: &str,
    subject: &str,
    usage: &str,
) -> Result<(), ServerError> {
    let (key, csr, ext, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.ext"),
        format!("{name}.crt"),
    );
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", &key, "-out", &csr,
        ],
    )?;
    std::fs::write(
        dir.join(&ext),
        format!("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n{usage}"),
    )?;
    let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ],
    )
}
