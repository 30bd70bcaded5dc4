//! The Dockerfile, the compose file and the Kubernetes manifests stay in step with the
//! binary: every environment variable they set is one the binary reads, ports agree, the
//! probes point at the real probe routes on the probe port, the service gets a worker token
//! wherever it listens on the network, and the hardening settings are in place. The
//! container engine cannot run here, so these files are checked by reading them.

use std::collections::BTreeSet;

use clap::CommandFactory;
use proxy_allocator::config::Config;
use serde_yaml::Value;

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_yaml::from_str(&read(path)).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

/// Every environment variable the binary reads: its options' variables, plus `RUST_LOG`.
fn known_env() -> BTreeSet<String> {
    let mut known: BTreeSet<String> = Config::command()
        .get_arguments()
        .filter_map(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
        .collect();
    known.insert("RUST_LOG".to_owned());
    known
}

fn port_of(listen: &str) -> u16 {
    listen
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {listen}"))
}

#[test]
fn the_binary_knows_the_variables_this_test_relies_on() {
    let known = known_env();
    for name in [
        "LISTEN_ADDR",
        "REDIS_URL",
        "ADMIN_TOKEN",
        "ADMIN_TOKEN_FILE",
        "WORKER_TOKEN",
        "WORKER_TOKEN_FILE",
        "PROBE_LISTEN",
        "KEY_PREFIX",
    ] {
        assert!(known.contains(name), "{name} missing from {known:?}");
    }
}

#[test]
fn the_compose_file_sets_only_known_variables_and_waits_for_a_persistent_redis() {
    let compose = yaml("docker-compose.yml");
    let service = &compose["services"]["proxy-allocator"];
    let env = service["environment"]
        .as_mapping()
        .expect("an environment map");
    let known = known_env();
    for (name, _) in env {
        let name = name.as_str().expect("a name");
        assert!(
            known.contains(name),
            "compose sets {name}, which the binary does not read"
        );
    }
    let listen = env[&Value::from("LISTEN_ADDR")]
        .as_str()
        .expect("LISTEN_ADDR");
    assert!(
        listen.starts_with("0.0.0.0:"),
        "inside a container: {listen}"
    );
    let published = service["ports"][0].as_str().expect("a port mapping");
    assert_eq!(
        published.rsplit(':').next().map(str::parse::<u16>),
        Some(Ok(port_of(listen)))
    );
    assert_eq!(
        service["depends_on"]["redis"]["condition"],
        Value::from("service_healthy")
    );

    // Both tokens are secrets mounted where their _FILE variables point; on 0.0.0.0 the
    // service would refuse to start without the worker token.
    let secrets: Vec<&str> = service["secrets"]
        .as_sequence()
        .expect("secrets")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for (token, secret) in [
        ("ADMIN_TOKEN", "admin_token"),
        ("WORKER_TOKEN", "worker_token"),
    ] {
        assert!(secrets.contains(&secret), "{secret} in {secrets:?}");
        assert_eq!(
            env[&Value::from(format!("{token}_FILE"))].as_str(),
            Some(format!("/run/secrets/{secret}").as_str())
        );
        assert!(compose["secrets"][secret]["file"].is_string());
        assert!(
            env.get(Value::from(token)).is_none(),
            "no token in the file itself"
        );
    }

    // The probes have their own port, which is not published.
    let probes = env[&Value::from("PROBE_LISTEN")]
        .as_str()
        .expect("PROBE_LISTEN");
    assert!(probes.starts_with("0.0.0.0:"), "{probes}");
    assert_ne!(port_of(probes), port_of(listen));
    assert_eq!(service["ports"].as_sequence().map(Vec::len), Some(1));

    let redis = &compose["services"]["redis"];
    let command: Vec<&str> = redis["command"]
        .as_sequence()
        .expect("a command")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for pair in [["--appendonly", "yes"], ["--appendfsync", "everysec"]] {
        assert!(
            command.windows(2).any(|w| w == pair),
            "{pair:?} in {command:?}"
        );
    }
    assert!(redis["healthcheck"]["test"].is_sequence());
    let url = env[&Value::from("REDIS_URL")].as_str().expect("REDIS_URL");
    assert_eq!(url, "redis://redis:6379");
}

#[test]
fn the_kubernetes_deployment_is_hardened_probed_and_sets_only_known_variables() {
    let deployment = yaml("deploy/kubernetes/deployment.yaml");
    let spec = &deployment["spec"];
    assert!(spec["replicas"].as_u64().is_some_and(|n| n >= 2));
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], Value::from(true));
    let container = &pod["containers"][0];
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"],
        Value::from(true)
    );
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        Value::from(false)
    );
    assert!(container["resources"]["requests"]["cpu"].is_string());
    assert!(container["resources"]["requests"]["memory"].is_string());
    assert_eq!(
        container["livenessProbe"]["httpGet"]["path"],
        Value::from("/livez")
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"],
        Value::from("/readyz")
    );

    let known = known_env();
    let secret = yaml("deploy/kubernetes/secret.example.yaml");
    let mut listen = None;
    let mut probe_listen = None;
    let mut worker_token_from_secret = false;
    for var in container["env"].as_sequence().expect("env") {
        let name = var["name"].as_str().expect("a name");
        assert!(
            known.contains(name),
            "the deployment sets {name}, which the binary does not read"
        );
        if name == "LISTEN_ADDR" {
            listen = var["value"].as_str();
        }
        if name == "PROBE_LISTEN" {
            probe_listen = var["value"].as_str();
        }
        if name == "WORKER_TOKEN" {
            worker_token_from_secret = var["valueFrom"]["secretKeyRef"]["key"].is_string();
        }
        if let Some(key) = var["valueFrom"]["secretKeyRef"]["key"].as_str() {
            assert_eq!(
                var["valueFrom"]["secretKeyRef"]["name"],
                secret["metadata"]["name"]
            );
            assert!(
                secret["stringData"][key].is_string(),
                "the example secret lacks {key}"
            );
        }
    }
    let listen = listen.expect("LISTEN_ADDR is set");
    assert!(listen.starts_with("0.0.0.0:"));
    assert_eq!(
        container["ports"][0]["containerPort"].as_u64(),
        Some(u64::from(port_of(listen)))
    );
    assert!(
        worker_token_from_secret,
        "on 0.0.0.0 the service needs a worker token, from the secret"
    );

    // Both probes point at the named port whose number is PROBE_LISTEN's.
    let probe_listen = probe_listen.expect("PROBE_LISTEN is set");
    assert!(probe_listen.starts_with("0.0.0.0:"));
    for probe in ["livenessProbe", "readinessProbe"] {
        let name = &container[probe]["httpGet"]["port"];
        let port = container["ports"]
            .as_sequence()
            .expect("ports")
            .iter()
            .find(|port| &port["name"] == name)
            .unwrap_or_else(|| panic!("{probe} names the port {name:?}, which is not declared"));
        assert_eq!(
            port["containerPort"].as_u64(),
            Some(u64::from(port_of(probe_listen))),
            "{probe}"
        );
    }

    let service = yaml("deploy/kubernetes/service.yaml");
    assert_eq!(service["spec"]["selector"], spec["selector"]["matchLabels"]);
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"],
        container["ports"][0]["name"]
    );
}

#[test]
fn the_dockerfile_runs_as_non_root_checks_livez_and_sets_only_known_variables() {
    let dockerfile = read("Dockerfile");
    let known = known_env();
    let mut env_names = Vec::new();
    let mut listen = None;
    let mut probe_listen = None;
    // ENV lines may continue with backslashes; join them first.
    let joined = dockerfile.replace("\\\n", " ");
    for line in joined.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("ENV ") {
            for pair in rest.split_whitespace() {
                let (name, value) = pair.split_once('=').expect("ENV NAME=value");
                env_names.push(name.to_owned());
                if name == "LISTEN_ADDR" {
                    listen = Some(value.to_owned());
                }
                if name == "PROBE_LISTEN" {
                    probe_listen = Some(value.to_owned());
                }
            }
        }
    }
    for name in &env_names {
        assert!(
            known.contains(name),
            "the Dockerfile sets {name}, which the binary does not read"
        );
    }
    let listen = listen.expect("the image sets LISTEN_ADDR");
    let probe_listen = probe_listen.expect("the image sets PROBE_LISTEN");
    assert!(listen.starts_with("0.0.0.0:"));
    let exposed: Vec<u16> = joined
        .lines()
        .filter_map(|l| l.trim().strip_prefix("EXPOSE "))
        .flat_map(str::split_whitespace)
        .map(|port| port.parse().expect("a port"))
        .collect();
    assert_eq!(exposed, [port_of(&listen), port_of(&probe_listen)]);
    assert!(joined.lines().any(|l| l.trim().starts_with("USER nonroot")));
    let healthcheck = joined
        .lines()
        .find(|l| l.starts_with("HEALTHCHECK"))
        .expect("a HEALTHCHECK");
    assert!(
        healthcheck.contains(&format!("127.0.0.1:{}/livez", port_of(&probe_listen))),
        "{healthcheck}"
    );
}
