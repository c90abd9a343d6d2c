-- Run once by the postgres image on an empty data folder (docker-entrypoint-initdb.d):
-- MLflow's basic-auth users and permissions live in a database of their own.
CREATE DATABASE mlflow_auth;
