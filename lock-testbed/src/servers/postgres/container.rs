//! PostgreSQL in a container (feature `testcontainers`).

use testcontainers::{GenericImage, ImageExt};

use super::{PostgresOptions, postgres_url};
use crate::servers::ServerError;
use crate::servers::containers::{
    Container, DEFAULT_POSTGRES_IMAGE, POSTGRES_IMAGE_ENV, Postgres, ServerSpec,
};
use crate::servers::probe::Probe;

/// Where the cluster lives in a container (it survives a restart of the container).
const DATA_DIR: &str = "/var/tmp/postgres";

impl Container<Postgres> {
    /// Starts the image from [`POSTGRES_IMAGE_ENV`] (default [`DEFAULT_POSTGRES_IMAGE`]):
    /// makes a cluster on first start (the superuser's password and the settings of
    /// `opts`; connections from outside the container trusted, or asked for the password
    /// when one is set), runs the server as the `postgres` user, and waits (bounded by
    /// `opts.startup_timeout`) until it takes connections. `opts.bin_dir` is ignored: the
    /// image's newest PostgreSQL runs.
    pub async fn start(opts: &PostgresOptions) -> Result<Self, ServerError> {
        let method = if opts.password.is_some() {
            "scram-sha-256"
        } else {
            "trust"
        };
        let password_file = opts
            .password
            .as_ref()
            .map(|_| format!("{DATA_DIR}/password"));
        let initdb_args = opts.initdb_args(password_file.as_deref()).join(" ");
        let mut server_args = opts.server_args();
        server_args.extend(["-c".to_owned(), "listen_addresses=*".to_owned()]);
        let server_args = server_args
            .iter()
            .map(|arg| format!("'{}'", arg.replace('\'', "'\\''")))
            .collect::<Vec<_>>()
            .join(" ");
        let script = format!(
            "set -e; bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1); d={DATA_DIR}; \
             if [ ! -d $d/data ]; then \
               mkdir -p $d; printf '%s' \"$POSTGRES_PASSWORD\" > $d/password; \
               chown -R postgres:postgres $d; \
               runuser -u postgres -- $bin/initdb -D $d/data {initdb_args} >/dev/null; \
               echo 'host all all 0.0.0.0/0 {method}' >> $d/data/pg_hba.conf; \
             fi; \
             exec setpriv --reuid postgres --regid postgres --init-groups -- $bin/postgres -D $d/data -p 5432 -k $d {server_args}"
        );
        let password = opts.password.clone().unwrap_or_default();
        let configure = move |image: GenericImage| {
            image
                .with_env_var("POSTGRES_PASSWORD", password.clone())
                .with_cmd(["sh".to_owned(), "-c".to_owned(), script.clone()])
        };
        let spec = ServerSpec {
            server: "PostgreSQL".to_owned(),
            image: (POSTGRES_IMAGE_ENV, DEFAULT_POSTGRES_IMAGE),
            internal: 5432,
            probe: Probe::PostgresStartup,
            startup_timeout: opts.startup_timeout,
            host_port: None,
        };
        let kind = Postgres {
            password: opts.password.clone(),
        };
        Self::launch(spec, configure, kind).await
    }

    /// `postgres://postgres[:password]@127.0.0.1:port/postgres`.
    pub fn url(&self) -> String {
        postgres_url("127.0.0.1", self.port(), self.kind.password.as_deref())
    }
}
