"""`gwpolicy mesh`: the data plane of the mesh (east-west), one NGINX per client namespace."""
