"""After converge: Prometheus on node1 reports both nodes' node_exporter and itself up, with gpufleet's alert
rules loaded; each program listens on its node's cluster address only and runs as a dynamic user."""

import json

testinfra_hosts = ["node1"]


def prometheus(host, path):
    address = host.ansible.get_variables()["gpufleet_node_ip"]
    answer = host.run(f"curl -sf http://{address}:9090{path}")
    assert answer.rc == 0, answer.stderr
    body = json.loads(answer.stdout)
    assert body["status"] == "success", body
    return body["data"]


def test_every_target_is_up(host):
    targets = prometheus(host, "/api/v1/targets?state=active")["activeTargets"]
    seen = sorted((t["labels"]["job"], t["labels"]["node"], t["health"]) for t in targets)
    assert seen == [("node", "node1", "up"), ("node", "node2", "up"), ("prometheus", "node1", "up")]


def test_the_six_alerts_are_loaded(host):
    groups = prometheus(host, "/api/v1/rules")["groups"]
    alerts = sorted(rule["name"] for group in groups for rule in group["rules"])
    assert alerts == sorted(
        [
            "TargetDown",
            "VllmInterTokenLatencyP99High",
            "VllmKvCacheAlmostFull",
            "VllmPreempting",
            "VllmTtftP99High",
            "VllmWaitingQueueGrowing",
        ]
    )


def test_prometheus_listens_on_the_cluster_address_only_as_a_dynamic_user(host):
    address = host.ansible.get_variables()["gpufleet_node_ip"]
    listening = host.run("ss -Hltn 'sport = :9090'").stdout.split()
    assert f"{address}:9090" in listening and "0.0.0.0:9090" not in listening and "*:9090" not in listening
    user = host.run("ps -o user= -C prometheus").stdout.strip()
    assert user and user != "root", user
