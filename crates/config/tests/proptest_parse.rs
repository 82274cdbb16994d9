//! Property tests for the parser's contract: for any input, `parse` never
//! panics and returns either a config or a non-empty list of errors, each
//! with a 1-based position inside the file. Runs the same entry point as
//! the cargo-fuzz target (`fuzz/fuzz_targets/parse.rs`), on stable Rust.

use proptest::prelude::*;

/// Keys: every real key, plus near misses and junk.
fn key() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "user",
        "control_socket",
        "cores",
        "metrics_listen",
        "log_level",
        "small",
        "standard",
        "jumbo",
        "name",
        "input",
        "outputs",
        "core",
        "interface",
        "address",
        "adress",
        "port",
        "source",
        "ingress",
        "receive_buffer_bytes",
        "ttl",
        "source_address",
        "queue_depth",
        "flow",
        "daemon",
        "pools",
        "\"quoted key\"",
        "\"ключ\"",
        "a.b",
    ])
    .prop_map(str::to_owned)
}

/// Scalar values drawn from the interesting ones.
fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "\"239.1.1.1\"",
            "\"239.1.1.300\"",
            "\"ff3e::1\"",
            "\"10.0.0.1\"",
            "\"2001:db8::1\"",
            "\"0.0.0.0\"",
            "\"::\"",
            "\"eth0\"",
            "\"eth1\"",
            "\"\"",
            "\"a-very-long-interface\"",
            "\"socket\"",
            "\"packet\"",
            "\"info\"",
            "\"127.0.0.1:9464\"",
            "\"/run/x.sock\"",
            "0",
            "1",
            "-1",
            "255",
            "256",
            "5000",
            "65535",
            "65536",
            "1000000",
            "1000001",
            "9223372036854775807",
            "-9223372036854775808",
            "0x10",
            "1.5",
            "inf",
            "nan",
            "true",
            "1979-05-27T07:32:00Z",
            "[]",
            "{}",
            "\"\\u00e9\"",
        ])
        .prop_map(str::to_owned),
        any::<i64>().prop_map(|n| n.to_string()),
        "[a-z0-9.:]{0,12}".prop_map(|s| format!("{s:?}")),
    ]
}

/// A value: a scalar, an array of scalars, or an inline table.
fn value() -> impl Strategy<Value = String> {
    let leaf = scalar();
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            prop::collection::vec((key(), inner), 0..6).prop_map(|kv| {
                let body: Vec<String> = kv.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                format!("{{ {} }}", body.join(", "))
            }),
        ]
    })
}

/// A line of a TOML-ish document: a header, a key/value pair, a comment or
/// occasionally garbage.
fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (key(), value()).prop_map(|(k, v)| format!("{k} = {v}")),
        2 => prop::sample::select(vec![
            "[daemon]", "[pools]", "[[flow]]", "[flow.input]", "[[flow.outputs]]", "[flow]",
            "[[daemon]]", "# comment", "",
        ]).prop_map(str::to_owned),
        1 => "[ -~]{0,20}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn toml_ish_documents_never_panic(lines in prop::collection::vec(line(), 0..30)) {
        let text = lines.join("\n");
        let line_count = u32::try_from(text.split('\n').count()).unwrap();
        if let Err(errors) = mcrelay_config::fuzz_parse(text.as_bytes()) {
            prop_assert!(!errors.is_empty());
            for e in &errors {
                prop_assert!(e.line >= 1 && e.line <= line_count, "{e} (of {line_count} lines)");
                prop_assert!(e.column >= 1);
                prop_assert!(e.to_string().starts_with("fuzz.toml:"));
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = mcrelay_config::fuzz_parse(&bytes);
    }

    #[test]
    fn valid_configs_parse_completely(
        flows in prop::collection::btree_map("[a-z][a-z0-9-]{0,10}", (1u8..4, any::<bool>(), 1u8..=255), 0..8),
        small in 1u32..5000,
    ) {
        let mut text = format!("[pools]\nsmall = {small}\n");
        for (i, (name, (outputs, v6, ttl))) in flows.iter().enumerate() {
            let group = if *v6 { format!("\"ff3e::{:x}\"", i + 1) } else { format!("\"239.1.1.{}\"", i + 1) };
            text.push_str(&format!(
                "[[flow]]\nname = \"{name}\"\ninput = {{ interface = \"eth0\", address = {group}, port = 5000 }}\noutputs = [\n"
            ));
            for o in 0..*outputs {
                text.push_str(&format!(
                    "  {{ interface = \"eth1\", address = \"10.0.0.{}\", port = {}, ttl = {ttl} }},\n",
                    o + 1,
                    6000 + u16::from(o)
                ));
            }
            text.push_str("]\n");
        }
        let config = mcrelay_config::parse(&text, "gen.toml");
        prop_assert!(config.is_ok(), "{}\n{}", text, config.unwrap_err());
        let config = config.unwrap();
        prop_assert_eq!(config.flows.len(), flows.len());
        prop_assert_eq!(config.pools.small, small);
        for (name, (outputs, _, ttl)) in &flows {
            let f = config.flows.by_name(name).unwrap();
            prop_assert_eq!(f.outputs.len(), usize::from(*outputs));
            prop_assert!(f.outputs.iter().all(|o| o.ttl == *ttl));
            prop_assert_eq!(config.flows.get(f.id).unwrap().name.as_str(), name.as_str());
        }
        // A table diffed against itself is all unchanged.
        let d = config.flows.diff(&config.flows);
        prop_assert!(d.is_empty());
        prop_assert_eq!(d.unchanged.len(), flows.len());
    }
}
