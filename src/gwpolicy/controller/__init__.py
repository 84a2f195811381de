"""The controller: the cluster's model kept analysed in place, and the status and EffectivePolicy writes."""
