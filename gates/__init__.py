"""Control events, the gated Kafka source (stop gate) and the gated sink (start gate)."""
