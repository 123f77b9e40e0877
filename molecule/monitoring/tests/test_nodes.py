"""On every node: node_exporter listens on the node's cluster address only, enabled at boot."""


def test_node_exporter_listens_on_the_cluster_address_only(host):
    address = host.ansible.get_variables()["gpufleet_node_ip"]
    listening = host.run("ss -Hltn 'sport = :9100'").stdout.split()
    assert f"{address}:9100" in listening and "0.0.0.0:9100" not in listening and "*:9100" not in listening
    service = host.service("gpufleet-node-exporter")
    assert service.is_running and service.is_enabled
